"""A try/except KeyError loop whose exception is raised ``depth + 2`` calls down."""

from __future__ import annotations

import daifu


def build(depth: int, vaccinate: bool):
    def inner(d, k):
        return d[k]

    def mid(d, k, depth):
        if depth:
            return mid(d, k, depth - 1)
        return inner(d, k)

    def outer(n):
        hits = 0
        for i in range(n):
            try:
                mid({}, i, depth)
            except KeyError:
                hits += 1
        return hits

    if vaccinate:  # (daifu.vaccinate records this file: callers' handlers are read here)
        for fn in (inner, mid, outer):
            daifu.vaccinate(fn)
    return outer


def build_own(vaccinate: bool):
    """``try: d[k]`` / ``except KeyError`` in the function that raises."""
    def own(n):
        d, hits = {}, 0
        for i in range(n):
            try:
                d[i]
            except KeyError:
                hits += 1
        return hits

    if vaccinate:
        daifu.vaccinate(own)
    return own
