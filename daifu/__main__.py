"""``python -m daifu``: see ``daifu.hooks._runner``."""

from daifu.hooks._runner import main

if __name__ == "__main__":
    main()
