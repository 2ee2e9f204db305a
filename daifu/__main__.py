"""``python -m daifu``: see ``daifu.hooks._runner``."""

from daifu.hooks import main

if __name__ == "__main__":
    main()
