"""Dense streaming: the layers a plan does not keep resident go through pool slots ahead of use.

    stream_layout.py   which tensors of a Plan stream, through which pool, and each streamed layer's slot
    layer_streamer.py  LayerStreamer: the compute hooks that fill slots ahead of use and free them after
"""
