"""A seeded GGUF mutation fuzzer: mutations of real seed models (gguf_model.py, mutators*.py),
each run through hypura-cli and hypura.Llama in a forked child (runner.py); run.py is the campaign."""
