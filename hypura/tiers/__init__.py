"""The bottom layer: the names of the tiers and disk reads around the page cache.

Everything above (profile, plan, runtime) speaks this vocabulary; nothing here imports from them.
"""
