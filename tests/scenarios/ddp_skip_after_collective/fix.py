import daifu


@daifu.on(KeyError, where="train")
def redo_the_log_line(crash):  # refused: the statement already ran its all_reduce
    crash.globals["LOG_WEIGHTS"][crash.vars["rank"]][crash.vars["step"]] = 1.0
    return daifu.RETRY


@daifu.on(KeyError, where="train")
def leave_the_log_entry_out(crash):  # allowed: what skip leaves out runs no collective
    return daifu.SKIP
