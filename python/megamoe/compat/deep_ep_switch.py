"""The switch that lets code written for DeepEP's HybridEP (Megatron-Core's
``from deep_ep import HybridEPBuffer``) run on megamoe, with no edit to that code.

``python -m megamoe.compat install-deep-ep`` writes a small package named ``deep_ep`` into this
interpreter's site-packages (or ``--target DIR``): it re-exports
:class:`megamoe.compat.hybrid_ep.HybridEPBuffer` and nothing else, so DeepEP's other buffer
(``from deep_ep import Buffer``, which Megatron tries inside ``try/except ImportError``) is an
ImportError and that path stays off. A marker file inside it names it megamoe's.

It refuses (exit status 2, nothing written) when Python already finds a ``deep_ep`` that is not
megamoe's, or pip knows a DeepEP distribution: a real DeepEP is never shadowed. Run it again to
rewrite megamoe's package; ``uninstall-deep-ep`` removes it (and refuses to remove anything
else); ``status`` says which ``deep_ep`` Python finds.
"""

import importlib
import importlib.machinery
import importlib.metadata
import shutil
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

PACKAGE = "deep_ep"
MARKER = "MEGAMOE_COMPAT"
"""The file that marks a ``deep_ep`` package as megamoe's."""
DISTRIBUTIONS = ("deep_ep", "deep-ep", "deepep")
"""The names a pip-installed DeepEP goes by."""

SHIM = '''"""megamoe's HybridEP-compatible buffer under DeepEP's package name, written by
``python -m megamoe.compat install-deep-ep`` so that code importing ``deep_ep.HybridEPBuffer``
(Megatron-Core's flex token dispatcher, backend "hybridep") runs on megamoe. DeepEP's other
buffer is not here: ``from deep_ep import Buffer`` raises ImportError. Remove this package with
``python -m megamoe.compat uninstall-deep-ep``."""

from megamoe.compat.hybrid_ep import HybridEPBuffer

__all__ = ["HybridEPBuffer"]
'''


class SwitchError(Exception):
    """The switch refused: the message says why and what to do."""


def site_dir(target: Optional[str] = None) -> Path:
    """Where the package goes: ``target``, else this interpreter's site-packages."""
    return Path(target) if target is not None else Path(sysconfig.get_paths()["purelib"])


def is_megamoe(package_dir: Path) -> bool:
    return (package_dir / MARKER).is_file()


def find_deep_ep(search_path: Optional[Sequence[str]] = None) -> Optional[Path]:
    """The directory (or module file) of the ``deep_ep`` Python would import from
    ``search_path`` (default ``sys.path``), without importing it; None when there is none."""
    importlib.invalidate_caches()  # directories may have changed since Python listed them
    spec = importlib.machinery.PathFinder.find_spec(PACKAGE, None if search_path is None else list(search_path))
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(spec.origin) if spec.origin else None


def installed_distribution() -> Optional[str]:
    """The name and version of a pip-installed DeepEP, or None."""
    for name in DISTRIBUTIONS:
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _foreign(found: Optional[Path]) -> bool:
    return found is not None and not (found.is_dir() and is_megamoe(found))


def install(target: Optional[str] = None, search_path: Optional[Sequence[str]] = None) -> Path:
    """Writes megamoe's ``deep_ep`` package into ``target`` (default: site-packages) and returns
    its directory. Raises SwitchError, having written nothing, when a ``deep_ep`` that is not
    megamoe's is found on ``search_path`` (default ``sys.path``) or in ``target``, or pip knows a
    DeepEP distribution."""
    dest = site_dir(target) / PACKAGE
    for found in (find_deep_ep(search_path), find_deep_ep([str(dest.parent)])):
        if _foreign(found):
            raise SwitchError(
                f"a DeepEP is installed at {found}: megamoe does not shadow it. Use that DeepEP, "
                f"or uninstall it (pip uninstall deep_ep) and run install-deep-ep again."
            )
    dist = installed_distribution()
    if dist is not None:
        raise SwitchError(
            f"pip has DeepEP installed ({dist}): megamoe does not shadow it. Use that DeepEP, "
            f"or uninstall it (pip uninstall {dist.split()[0]}) and run install-deep-ep again."
        )
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "__init__.py").write_text(SHIM)
    (dest / MARKER).write_text("Written by python -m megamoe.compat install-deep-ep.\n")
    return dest


def uninstall(target: Optional[str] = None) -> Optional[Path]:
    """Removes megamoe's ``deep_ep`` package from ``target`` (default: site-packages) and returns
    the directory removed, or None when there was none. Raises SwitchError when the ``deep_ep``
    there is not megamoe's (it is left alone)."""
    dest = site_dir(target) / PACKAGE
    if not dest.exists():
        return None
    if not (dest.is_dir() and is_megamoe(dest)):
        raise SwitchError(f"{dest} is not megamoe's deep_ep package: left alone.")
    shutil.rmtree(dest)
    return dest


def status(search_path: Optional[Sequence[str]] = None) -> str:
    """One line: which ``deep_ep`` Python finds, and whose it is."""
    found = find_deep_ep(search_path)
    if found is None:
        return "deep_ep: not found"
    if not _foreign(found):
        return f"deep_ep: megamoe's HybridEP-compatible buffer, at {found}"
    return f"deep_ep: another package (DeepEP?), at {found}"


USAGE = """usage: python -m megamoe.compat COMMAND [--target DIR]

commands:
  install-deep-ep     make `import deep_ep` find megamoe's HybridEPBuffer (Megatron-Core's
                      flex dispatcher, backend "hybridep"); refuses when DeepEP is installed
  uninstall-deep-ep   remove it
  status              say which deep_ep Python finds

--target DIR: the directory to write into or remove from (default: this interpreter's
site-packages)."""


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    target = None
    if "--target" in args:
        i = args.index("--target")
        if i + 1 >= len(args):
            print(USAGE, file=sys.stderr)
            return 2
        target = args[i + 1]
        del args[i : i + 2]
    if len(args) != 1 or args[0] not in ("install-deep-ep", "uninstall-deep-ep", "status"):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        if args[0] == "install-deep-ep":
            print(f"installed megamoe's deep_ep (HybridEPBuffer) at {install(target)}")
        elif args[0] == "uninstall-deep-ep":
            removed = uninstall(target)
            print(f"removed {removed}" if removed else f"no deep_ep package in {site_dir(target)}")
        else:
            print(status())
    except SwitchError as e:
        print(f"megamoe.compat: {e}", file=sys.stderr)
        return 2
    return 0
