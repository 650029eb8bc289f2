"""``diarist eval``: score transcripts against the references of a data folder (WER/CER, cpWER, DER/JER,
RTF). A consumer of the service core, like ``benchmarks/``: nothing of the service imports it; the CLI
runs it (``cli/commands/eval.py``)."""
