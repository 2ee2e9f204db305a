import daifu


@daifu.on(KeyError, where="train")
def drop_the_step(crash):  # refused: what it leaves out holds the epoch-end all_reduce
    return daifu.CONTINUE


@daifu.on(KeyError, where="train")
def leave_the_log_entry_out(crash):  # allowed: what skip leaves out runs no collective
    return daifu.SKIP
