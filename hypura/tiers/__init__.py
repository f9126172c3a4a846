"""The bottom layer: the names of the tiers and disk reads around the page cache.

Everything above (profile, plan, runtime) speaks this vocabulary; nothing here imports from them.

    names.py         the tiers (gpu, ram, disk), fastest first, and cpu as a compute place
    direct_io.py     DirectReader: O_DIRECT reads in aligned staging buffers, every failure reported
    file_readers.py  FileReaders: one DirectReader per file of a model, opened at first use
    residency.py     how much of a file the page cache holds now (mincore), and evicting it
"""
