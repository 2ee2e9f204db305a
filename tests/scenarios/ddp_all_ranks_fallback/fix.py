import daifu


@daifu.on(KeyError, where="reduced_loss")
def retry_on_every_rank(crash):
    # cannot be agreed: rank 0 did not crash (it waits in DDP's all-reduce);
    # refused at once, so the rank-local rule below still has time to work
    return daifu.all_ranks(daifu.RETRY)


@daifu.on(KeyError, where="reduced_loss")
def complete_the_schedule(crash):
    crash.globals["SCALES"][crash.vars["rank"]][crash.vars["step"]] = 1.0
    return daifu.RETRY
