"""The developer deletes the failing line and reloads: the running loop
continues in the new code after it, with the same batch, step and optimizer
state."""

import daifu

LINE = "            note = DEBUG[seen]  # leftover debugging: DEBUG has the first steps only\n"


@daifu.on(KeyError, where="train")
def delete_the_line_and_reload(crash):
    with open(crash.filename) as fh:
        source = fh.read()
    if LINE not in source:
        return None
    with open(crash.filename, "w") as fh:
        fh.write(source.replace(LINE, ""))
    return daifu.RELOAD
