import os

import daifu


@daifu.on(RuntimeError, where="main")
def create_checkpoint_dir(crash):
    if "Parent directory" not in str(crash.exception):
        return None
    os.makedirs(crash.vars["ckpt_dir"], exist_ok=True)
    return daifu.RETRY
