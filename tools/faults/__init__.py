"""A fault-injection upstream: an OpenAI-compatible server in llama.cpp's wire format whose
misbehaviour is chosen per request (``x-fault`` header or a ``fault:<name>`` model). For
tests and for reproducing a failure by hand (``scripts/faulty-upstream --list``). The
gateway never imports it."""
