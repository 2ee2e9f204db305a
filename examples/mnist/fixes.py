"""Fixes for train.py, applied in the live process when its crashes happen."""

import os

import daifu


@daifu.on(RuntimeError, where="main")
def make_checkpoint_dir(crash):
    # torch.save: "Parent directory runs/mnist/checkpoints does not exist."
    if "Parent directory" not in str(crash.exception):
        return None  # not mine: let the next rule decide
    path = crash.vars["ckpt_path"]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    print(f"[fix] created {os.path.dirname(path)}; retrying: {crash.statement}", flush=True)
    return daifu.RETRY


def predict(model, data):
    """The corrected predict(): the CNN takes the images as they are."""
    return model(data)


@daifu.on(RuntimeError, where="evaluate")
def fix_predict(crash):
    if "conv2d" not in str(crash.exception):
        return None
    daifu.replace(crash.globals["predict"], predict)
    print(f"[fix] replaced predict(); retrying: {crash.statement}", flush=True)
    return daifu.RETRY
