"""Out of memory: the buffer size is set in the crashed frame to the intended
value and the allocation is retried (each later evaluation recomputes the
size, so the rule fires again there)."""

import daifu


@daifu.on(RuntimeError, where="evaluate")
def smaller_buffer(crash):
    if "can't allocate memory" not in str(crash.exception):
        return None
    crash.exec("chunk_elems = 1 << 20")
    return daifu.RETRY
