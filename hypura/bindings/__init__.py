"""Hypura's side of llama.cpp, 1:1 with its C APIs: our hook API through cffi, llama.cpp's own objects over
llama-cpp-python's ctypes binding. Policy lives above (hypura.runtime, hypura.loaded).

    library.py       where our patched libllama lives, and llama-cpp-python made to load that same file
    ffi.py           cffi declarations of include/hypura.h and the few ggml calls Hypura makes itself
    llama_params.py  llama-cpp-python's Llama keywords as llama_model_params and llama_context_params
    model.py         llama.cpp's model and context, owned in the caller's ExitStack; BareModel (no hooks)
    vocab.py         Vocab: tokenize, pieces, end-of-generation flags and special tokens of a llama_vocab
    batch.py         Batch: a llama_batch, owned or borrowed
    chat_formats.py  the chat format create_chat_completion uses, templates rendered by hypura.chat_template
    llama_log.py     LogCapture: llama.cpp's error log lines during a call, to say why it failed
"""
