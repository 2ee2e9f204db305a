"""The developer's edit of evaluate(), applied to the running job's source,
then reload: the crashed evaluation continues in the corrected code at the
failing statement (same batch, same running totals)."""

import daifu

BUG = '            total += F.cross_entropy(logits.reshape(-1, VOCAB), y, reduction="sum").item()\n'
FIX = ('            total += F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1),\n'
       '                                     reduction="sum").item()\n')


@daifu.on(ValueError, where="evaluate")
def edit_and_reload(crash):
    if "to match target batch_size" not in str(crash.exception):
        return None
    with open(crash.filename) as fh:
        source = fh.read()
    if BUG not in source:
        return None
    with open(crash.filename, "w") as fh:
        fh.write(source.replace(BUG, FIX))
    return daifu.RELOAD
