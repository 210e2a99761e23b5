"""What every picture shares: a Figure without pyplot, and the atomic PNG write of minidl.plot."""
from matplotlib.figure import Figure

from minidl.plot import save  # noqa: F401 - the figures' one way to write a PNG


def new_figure(rows, columns, size):
    """(figure, axes): `rows`×`columns` subplots, laid out without overlap."""
    figure = Figure(figsize=size, layout="constrained")
    return figure, figure.subplots(rows, columns)
