"""Integer arithmetic that sizes buffers and grids (shared by the optimizer, the all-reduce and
the kernel launchers, none of which should import another for it)."""


def ceil_div(a, b):
    """⌈a / b⌉ for integers, b > 0."""
    return -(-a // b)


def round_up(count, multiple):
    """The smallest multiple of `multiple` that is >= count (a padded buffer length)."""
    return ceil_div(count, multiple) * multiple
