"""``./dev`` makes its venv with a Python the project runs on (3.11 or later), or says which
one it found and the fix: a ``.venv`` left by an older Python is made again, a venv the user
named (``LINEAGE_RELAY_VENV``) is never removed, and a ``python -m venv`` that fails half-way
(Debian without ``python3.X-venv``) leaves nothing behind that the next run would take as made.

The script runs for real, copied into a scratch project with a PATH of only the tools it uses
(no apt-get: nothing is installed) and fake ``python`` binaries that answer its version
checks, make a venv, and log what they were asked."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

DEV = Path(__file__).resolve().parents[1] / "dev"
TOOLS = ("bash", "dirname", "sed", "head", "id", "grep", "rm", "touch", "readlink")


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def fake_python(path: Path, version: str, log: Path, venv_works: bool = True) -> Path:
    """A ``python`` of ``version``: answers ./dev's version checks, makes a venv whose python
    logs its arguments (pip installs) and whose ``lineage-relay`` says it started; when
    ``venv_works`` is false, ``-m venv`` fails after making part of the directory (as Debian's
    Python without ensurepip does)."""
    ok = tuple(int(n) for n in version.split(".")) >= (3, 11)
    venv_python = f'#!/bin/sh\necho "venv-python $*" >> {log}\nexit 0\n'
    made = (f'/bin/mkdir -p "$3/bin"\n'
            f"/bin/cat > \"$3/bin/python\" <<'EOF'\n{venv_python}EOF\n"
            f'/bin/chmod +x "$3/bin/python"\n'
            f"/bin/cat > \"$3/bin/lineage-relay\" <<'EOF'\n#!/bin/sh\necho \"started: $*\"\nEOF\n"
            f'/bin/chmod +x "$3/bin/lineage-relay"\n')
    venv = (f'{made}echo "{path.name} made $3" >> {log}\nexit 0' if venv_works
            else f'/bin/mkdir -p "$3/bin"\n/bin/ln -s {path} "$3/bin/python"\n'
                 f'echo "Error: ensurepip is not available" >&2\nexit 1')
    return executable(path, f"""#!/bin/sh
case "$*" in
  *"print("*) echo {version}; exit 0 ;;
  *version_info*) exit {0 if ok else 1} ;;
  "-m venv "*)
{venv}
    ;;
esac
exit 0
""")


def project(tmp_path: Path) -> Path:
    """A scratch project: ./dev and a pyproject.toml."""
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy2(DEV, root / "dev")
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    return root


def run_dev(tmp_path: Path, root: Path, *pythons: tuple[str, str], env: dict[str, str] | None = None,
            venv_works: bool = True) -> subprocess.CompletedProcess[str]:
    """``./dev demo --no-spark`` (no Java needed) with ``pythons`` ((name, version), ...) on PATH."""
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    for tool in TOOLS:
        if not (tools / tool).exists():
            (tools / tool).symlink_to(shutil.which(tool))
    for name, version in pythons:
        fake_python(tools / name, version, tmp_path / "log", venv_works)
    full_env = {"PATH": str(tools), "HOME": str(tmp_path), **(env or {})}
    return subprocess.run([str(root / "dev"), "demo", "--no-spark"], env=full_env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def log_lines(tmp_path: Path) -> list[str]:
    log = tmp_path / "log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_venv_left_by_an_older_python_is_made_again(tmp_path):
    root = project(tmp_path)
    fake_python(root / ".venv" / "bin" / "python", "3.10", tmp_path / "old-log")
    (root / ".venv" / "left-by-3.10").touch()
    done = run_dev(tmp_path, root, ("python3", "3.12"))
    assert done.returncode == 0, done
    assert "dev: .venv cannot be used: it runs Python 3.10; making it again with python3" in done.stderr
    assert done.stdout == "started: demo --no-spark\n"
    assert not (root / ".venv" / "left-by-3.10").exists()
    lines = log_lines(tmp_path)
    assert lines[0] == "python3 made .venv"
    assert any(line.startswith("venv-python -m pip install -q -e .[test]") for line in lines), lines
    assert (root / ".venv" / ".installed").exists()


def test_a_venv_the_user_named_is_never_removed(tmp_path):
    root = project(tmp_path)
    theirs = tmp_path / "their-venv"
    fake_python(theirs / "bin" / "python", "3.9", tmp_path / "old-log")
    done = run_dev(tmp_path, root, ("python3", "3.12"), env={"LINEAGE_RELAY_VENV": str(theirs)})
    assert done.returncode == 1, done
    assert f"LINEAGE_RELAY_VENV={theirs} cannot be used: it runs Python 3.9; the project needs a venv of " \
           "Python 3.11 or later" in done.stderr
    assert f"fix: remove {theirs}, or point LINEAGE_RELAY_VENV at a new directory" in done.stderr
    assert (theirs / "bin" / "python").exists() and "started" not in done.stdout
    assert log_lines(tmp_path) == []


def test_a_too_old_python_is_refused_with_the_fix(tmp_path):
    root = project(tmp_path)
    done = run_dev(tmp_path, root, ("python3", "3.10"))
    assert done.returncode == 1, done
    assert "dev: the project needs Python 3.11 or later; python3 is 3.10." in done.stderr
    assert "run with PYTHON=/path/to/python3.11" in done.stderr
    assert not (root / ".venv").exists() and log_lines(tmp_path) == []


def test_a_newer_python_on_path_is_taken_when_python3_is_too_old(tmp_path):
    root = project(tmp_path)
    done = run_dev(tmp_path, root, ("python3", "3.10"), ("python3.12", "3.12"))
    assert done.returncode == 0, done
    assert log_lines(tmp_path)[0] == "python3.12 made .venv"
    assert done.stdout == "started: demo --no-spark\n"


def test_python_names_the_interpreter_even_an_old_one(tmp_path):
    root = project(tmp_path)
    done = run_dev(tmp_path, root, ("python3.12", "3.12"), ("python3.10", "3.10"),
                   env={"PYTHON": "python3.10"})
    assert done.returncode == 1 and "python3.10 is 3.10" in done.stderr, done


def test_a_venv_that_fails_half_way_leaves_nothing_and_says_what_to_install(tmp_path):
    root = project(tmp_path)
    done = run_dev(tmp_path, root, ("python3", "3.11"), venv_works=False)
    assert done.returncode == 1, done
    assert "ensurepip is not available" in done.stderr
    assert "dev: 'python3 -m venv .venv' failed. fix: install python3.11-venv" in done.stderr
    assert not (root / ".venv").exists()
    # And the next run does not take a half-made venv as made: it tries again.
    again = run_dev(tmp_path, root, ("python3", "3.11"), venv_works=False)
    assert again.returncode == 1 and "ensurepip is not available" in again.stderr


def test_a_venv_whose_python_is_gone_is_made_again(tmp_path):
    root = project(tmp_path)
    (root / ".venv" / "bin").mkdir(parents=True)
    os.symlink(tmp_path / "uninstalled-python3.11", root / ".venv" / "bin" / "python")
    done = run_dev(tmp_path, root, ("python3", "3.13"))
    assert done.returncode == 0, done
    assert "dev: .venv cannot be used: its Python is gone" in done.stderr and "making it again" in done.stderr
    assert log_lines(tmp_path)[0] == "python3 made .venv"


def test_a_folder_named_by_lineage_relay_venv_is_kept_when_the_venv_cannot_be_made(tmp_path):
    """A LINEAGE_RELAY_VENV naming an existing folder (a mistake) with no venv in it: a failed
    ``python -m venv`` removed the whole folder."""
    root = project(tmp_path)
    theirs = tmp_path / "my-envs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    done = run_dev(tmp_path, root, ("python3", "3.11"), env={"LINEAGE_RELAY_VENV": str(theirs)}, venv_works=False)
    assert done.returncode == 1 and "ensurepip is not available" in done.stderr, done
    assert (theirs / "notes.txt").read_text() == "mine"


def test_a_venv_whose_python_does_not_start_is_named_and_kept(tmp_path):
    """PYTHONHOME set for another Python makes every interpreter fail at start: the working
    .venv was taken for one of an older Python and removed (a full reinstall), and the
    message blamed it."""
    root = project(tmp_path)
    executable(root / ".venv" / "bin" / "python",
               "#!/bin/sh\necho 'Fatal Python error: init_fs_encoding' >&2\nexit 1\n")
    (root / ".venv" / ".installed").touch()
    done = run_dev(tmp_path, root, ("python3", "3.12"), env={"PYTHONHOME": "/nonexistent"})
    assert done.returncode == 1, done
    assert "dev: .venv/bin/python does not start (PYTHONHOME=/nonexistent is set)" in done.stderr
    assert "fix: unset PYTHONHOME/PYTHONPATH" in done.stderr
    assert (root / ".venv" / "bin" / "python").exists() and log_lines(tmp_path) == []


def test_a_venv_made_without_pip_by_an_older_dev_is_made_again(tmp_path):
    """An older ./dev on a Debian without ensurepip left .venv/bin/python and no pip: every
    run then failed with "install failed" and no fix."""
    root = project(tmp_path)
    executable(root / ".venv" / "bin" / "python",
               '#!/bin/sh\ncase "$*" in *"-m pip --version"*) echo "No module named pip" >&2; exit 1 ;; esac\nexit 0\n')
    done = run_dev(tmp_path, root, ("python3", "3.12"))
    assert done.returncode == 0, done
    assert "dev: .venv cannot be used: it has no pip (made half-way); making it again with python3" in done.stderr
    assert log_lines(tmp_path)[0] == "python3 made .venv"
