"""A transient network error: resend the same step (the request that failed
never reached the simulator, so nothing has to be undone)."""

import daifu


@daifu.on(ConnectionError, where="run_episode")
def resend_step(crash):
    return daifu.RETRY
