"""Dense streaming: the layers a plan does not keep resident go through pool slots ahead of use."""
