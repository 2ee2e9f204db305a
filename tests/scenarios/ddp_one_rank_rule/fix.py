import daifu


@daifu.on(KeyError, where="reduced_loss")
def complete_the_schedule(crash):
    crash.globals["SCALES"][crash.vars["rank"]][crash.vars["step"]] = 1.0
    return daifu.RETRY
