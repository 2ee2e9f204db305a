"""A corrupted sensor frame: skip this step of the episode (daifu.CONTINUE
goes on with the next item of the step loop, like ``continue``)."""

import daifu


@daifu.on(ValueError, where="run_episode")
def skip_corrupted_frame(crash):
    if "non-finite observation" not in str(crash.exception):
        return None
    return daifu.CONTINUE
