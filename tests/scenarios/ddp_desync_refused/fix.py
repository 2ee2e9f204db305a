import daifu


@daifu.on(KeyError, where="train")
def drop_the_batch(crash):  # refused: rank 0 waits in this step's gradient all-reduce
    return daifu.CONTINUE


@daifu.on(KeyError, where="train")
def complete_the_schedule(crash):
    crash.globals["SCALES"][crash.vars["rank"]][crash.vars["step"]] = 1.0
    return daifu.RETRY
