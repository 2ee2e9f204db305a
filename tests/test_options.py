"""The options of ``python -m daifu``: one table (``hooks/_config.py``) that
argparse, the split of ``[options] script.py [args]``, ``--help`` and the
``DAIFU_*`` variables all read.  Every option is tested from the table, so a
new one is covered by adding it there."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import daifu
from daifu.hooks._config import BY_FLAG, OPTIONS, VARIABLES, Config, variables_help
from daifu.hooks._runner import _parser, _split_argv

from .support import run_daifu

ROOT = Path(__file__).resolve().parents[1]

#: a good value of each kind of value, none of them the default (absolute
#: paths, with {rank}: the variables children inherit say the same)
SAMPLES = {
    "FILE": os.path.join(os.sep, "data", "run-{rank}.txt"),
    "JOURNAL": os.path.join(os.sep, "data", "journal.jsonl"),
    "DIR": os.path.join(os.sep, "data", "checkpoints"),
    "PATTERNS": "mylib,train_*",
    "N": "3",
    "S": "5",
    "SECONDS": "7",
    "CMD": "true",
}

#: (option, spelling): every spelling of every option that takes a value
TAKE_VALUES = [(opt, flag) for opt in OPTIONS if opt.takes_value for flag in opt.flags]
FLAGS = [opt for opt in OPTIONS if opt.flags and not opt.takes_value and not opt.version]


def sample(opt) -> str:
    if opt.choices:
        return opt.choices[0]  # (debug: not the default)
    assert opt.metavar in SAMPLES, f"add a sample {opt.metavar} value for {opt.flags[0]} here"
    return SAMPLES[opt.metavar]


def configured(argv: list[str], env: dict[str, str] | None = None):
    """(settings, script, module, args) of ``python -m daifu ARGV`` with no
    ``DAIFU_*`` variable set (or ``env``'s)."""
    options, script, module, args = _split_argv(argv)
    cfg = Config.from_env(env or {})
    if options:
        cfg.override(_parser().parse_args(options))
    cfg.validate()
    return settings(cfg), script, module, args


def settings(cfg: Config) -> dict:
    """The fields the options set."""
    return {name: getattr(cfg, name)
            for name in {opt.field for opt in OPTIONS if opt.field} | {"eager"}}


def test_the_table_declares_every_option_argparse_knows():
    parser = _parser()
    known = {flag for action in parser._actions for flag in action.option_strings}
    assert known - {"-h", "--help"} == set(BY_FLAG)
    assert len(BY_FLAG) == sum(len(opt.flags) for opt in OPTIONS)  # each spelling once


@pytest.mark.parametrize("opt, flag", TAKE_VALUES, ids=[flag for _, flag in TAKE_VALUES])
def test_the_value_is_the_next_word_or_after_the_equals_sign(opt, flag):
    # `--checkpoint-dir ck train.py` was "expected one argument": the argv
    # split had its own list of the options that take a value
    value = sample(opt)
    default = configured(["train.py"])[0]
    separate = configured([flag, value, "train.py", flag, value, "--x"])
    joined = configured([f"{flag}={value}", "train.py", flag, value, "--x"])
    assert separate == joined
    got, script, module, args = separate
    assert (script, module, args) == ("train.py", None, [flag, value, "--x"])  # the script's
    expected = (*default[opt.field], value) if opt.repeat else opt.parsed(value, flag)
    assert got[opt.field] == expected != default[opt.field]
    assert {k: v for k, v in got.items() if k != opt.field} == \
        {k: v for k, v in default.items() if k != opt.field}
    by_module = configured([flag, value, "-m", "pkg.train", flag, value])
    assert by_module == (got, None, "pkg.train", [flag, value])


@pytest.mark.parametrize("opt", FLAGS, ids=lambda opt: opt.flags[0])
def test_a_flag_takes_no_value(opt):
    flag = opt.flags[0]
    got, script, _, args = configured([flag, "train.py", flag])
    assert (script, args) == ("train.py", [flag])
    if opt.field is not None:
        assert got[opt.field] == opt.const
        assert all(got[name] == value for name, value in opt.also)
        if got == configured(["train.py"])[0]:
            # a flag that says what the default is (--arm, since arming is
            # the default) still overrides its variable's other value
            assert opt.env is not None and isinstance(opt.const, bool)
            env = {opt.env: "0" if opt.const else "1"}
            assert configured(["train.py"], env)[0][opt.field] != opt.const
            assert configured([flag, "train.py"], env)[0] == got


@pytest.mark.parametrize("argv, dump, script", [
    (["--dump", "train.py", "x"], "-", "train.py"),       # a .py word is the script
    (["--dump", "--strict", "train.py"], "-", "train.py"),
    (["--dump", "out.txt", "train.py"], "out.txt", "train.py"),
    (["--dump=out.txt", "train.py"], "out.txt", "train.py"),
    (["--dump=x.py", "train.py"], "x.py", "train.py"),
    (["--dump", "--", "train"], "-", "train"),
])
def test_an_optional_value_is_taken_unless_it_is_an_option_or_the_script(argv, dump, script):
    got, got_script, _, _ = configured(argv)
    assert (got["dump"], got_script) == (dump, script)


@pytest.mark.parametrize("opt", [opt for opt in VARIABLES.values() if opt.flags],
                         ids=lambda opt: opt.env)
def test_what_an_option_sets_reaches_children_through_its_variable(opt, monkeypatch):
    for name in VARIABLES:  # (set first: put back as they were after the test)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    argv = [opt.flags[0], sample(opt)] if opt.takes_value else [opt.flags[0]]
    got = configured([*argv, "train.py"])[0]
    cfg = Config.from_env({})
    cfg.override(_parser().parse_args(argv))
    cfg.export()
    assert opt.env in os.environ
    assert settings(Config.from_env()) == got


def test_a_bad_value_is_one_error_naming_where_it_came_from():
    with pytest.raises(daifu.ConfigError, match="--grace must be a number of seconds, got 'x'"):
        configured(["--grace", "x", "train.py"])
    with pytest.raises(daifu.ConfigError, match="DAIFU_MAX_ATTEMPTS must be an integer, got"):
        Config.from_env({"DAIFU_MAX_ATTEMPTS": "three"})


def test_a_blank_variable_is_unset():
    blank = Config.from_env({name: " " for name in VARIABLES})
    assert settings(blank) == settings(Config.from_env({}))


def test_help_lists_every_option_and_variable():
    text = _parser().format_help()
    for opt in OPTIONS:
        for name in (*opt.flags, opt.env):
            if name is not None:
                assert name in text
    assert variables_help() in text


def test_the_readme_documents_every_option():
    readme = (ROOT / "README.md").read_text()
    for opt in OPTIONS:
        for flag in opt.flags:
            assert f"`{flag}" in readme, flag
        if opt.flags and opt.env is not None:
            assert f"`{opt.env}" in readme, opt.env


REPORT = ("import json, os, sys\n"
          "print(json.dumps([sys.argv[1:], os.environ['DAIFU_GRACE'],\n"
          "                  os.environ['DAIFU_CHECKPOINT_DIR']]))\n")


@pytest.mark.parametrize("form", ["separate", "joined"])
def test_the_documented_forms_run_the_script_with_its_own_args(tmp_path, form):
    (tmp_path / "report.py").write_text(REPORT)
    options = (["--checkpoint-dir", "ck", "--grace", "5"] if form == "separate"
               else ["--checkpoint-dir=ck", "--grace=5"])
    proc = run_daifu([*options, "report.py", "arg", "--grace", "7"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [["arg", "--grace", "7"], "5", str(tmp_path / "ck")]


def test_a_bad_value_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "report.py").write_text("print('ran')\n")
    proc = run_daifu(["--grace", "soon", "report.py"], cwd=tmp_path)
    assert proc.returncode == 2 and not proc.stdout
    assert proc.stderr.splitlines() == [
        "python -m daifu: error: --grace must be a number of seconds, got 'soon'"]
