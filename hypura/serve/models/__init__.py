"""The models a server offers and holds.

    registry.py       the models on offer and those loaded (at start, or on demand: its protocol), their names
    entry.py          a model on offer and one loaded: what the routes read of it, how it is opened, its file's identity
    retired.py        copies whose file changed, serving their requests to the end: one a model at most
    room.py           which idle models a load unloads, and the free memory it is planned within
    model_info.py     what is said about a model (its name, details and model_info, from the GGUF header)
    prompt_tokens.py  a model's vocabulary as bounds on tokenizing: refused before it when it cannot fit, in
                      pieces, stoppable
"""
