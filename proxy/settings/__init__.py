"""The settings store and config.yaml's file, history and watcher (SPEC §3, §8)."""
