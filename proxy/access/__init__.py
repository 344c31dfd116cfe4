"""Who may do what: the request's authorization and access keys' limits (SPEC §5, §13)."""
