"""Reading a checkpoint file, with one line that names the file and what is wrong with it.

Every load of this package goes through :func:`read_checkpoint`: the tools (``tools/test.py``,
the converters, ``extract_backbone.py``, the demo), the strict loaders of
:mod:`.checkpoint`, and, through the local-file scheme registered here with mmengine's
``CheckpointLoader``, the runner's own loads (``--resume``, ``load_from``, mmengine's
``Pretrained`` initializer). Before ``torch.load`` the file's first bytes and, for PyTorch's
zip format, its central directory are looked at (no tensor is read), so a truncated file, a
config or other text file, or another kind of file is a :class:`CheckpointFileError` such as::

    CheckpointFileError: cannot load the checkpoint work_dirs/x/epoch_3.pth: the file is
    truncated or damaged (1048576 bytes): it starts as a PyTorch checkpoint (a zip archive)
    but the end of the archive is missing

(one line), instead of PyTorch's ``failed finding central directory`` or pickle's ``invalid
load key, '#'``. The error is also logged when it is raised, so the line comes before any
traceback.
"""
import os
import os.path as osp
import re
import zipfile
from typing import Optional

__all__ = ['CheckpointFileError', 'checkpoint_file_problem', 'check_checkpoint_file',
           'read_checkpoint', 'last_good_checkpoint']

#: the pickled magic number at the start of PyTorch's legacy (non-zip) format
_LEGACY_TORCH = b'\x80\x02\x8a\x0a'
_OTHER_FORMATS = ((b'\x89PNG', 'a PNG image'), (b'\xff\xd8\xff', 'a JPEG image'),
                  (b'\x1f\x8b', 'a gzip archive'), (b'\x93NUMPY', 'a NumPy array file'),
                  (b'\x89HDF', 'an HDF5 file'))
_CONFIG = re.compile(r'^\s*(_base_|model|default_scope|custom_imports|train_cfg)\s*=', re.M)


class CheckpointFileError(ValueError):
    """A checkpoint file that cannot be read; ``path`` and ``problem`` say which and why."""

    def __init__(self, path: str, problem: str, what: str = 'checkpoint'):
        self.path, self.problem = path, problem
        super().__init__(f'cannot load the {what} {path}: {problem}')


def _text(head: bytes) -> Optional[str]:
    if b'\x00' in head:
        return None
    try:
        return head.decode('utf-8')
    except UnicodeDecodeError as err:  # a character cut at the end of the block
        return head[:err.start].decode('utf-8') if err.start > len(head) - 4 else None


def _text_problem(path: str, text: str) -> str:
    first = next((line.strip() for line in text.splitlines() if line.strip()), '')[:60]
    if path.endswith('.py') or _CONFIG.search(text):
        kind = 'a config (Python) file'
    elif text.lstrip().startswith(('{', '[')):
        kind = 'a JSON file'
    else:
        kind = 'a text file'
    return f'it is {kind}, not a checkpoint (it begins with {first!r})'


def _zip_problem(path: str, size: int) -> Optional[str]:
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return (f'the file is truncated or damaged ({size} bytes): it starts as a PyTorch '
                'checkpoint (a zip archive) but the end of the archive is missing')
    if not any(n == 'data.pkl' or n.endswith('/data.pkl') for n in names):
        return f'it is a zip archive, not a PyTorch checkpoint (it holds {names[:3]})'
    return None


def checkpoint_file_problem(path: str) -> Optional[str]:
    """What is wrong with the checkpoint file ``path`` as far as its structure shows, or None.

    Reads the first 4 KiB and, for a zip archive, its central directory; not the tensors.
    """
    if not osp.exists(path):
        return 'the file does not exist'
    if osp.isdir(path):
        return 'it is a folder, not a file'
    size = osp.getsize(path)
    if size == 0:
        return 'the file is empty (0 bytes): it was not written completely'
    with open(path, 'rb') as f:
        head = f.read(4096)
    if head.startswith(b'PK\x03\x04'):
        return _zip_problem(path, size)
    if head.startswith(_LEGACY_TORCH):
        return None
    for magic, kind in _OTHER_FORMATS:
        if head.startswith(magic):
            return f'it is {kind}, not a checkpoint'
    if head[:1] == b'\x80':
        return ('it is a pickle file, not a PyTorch checkpoint (e.g. metrics written by '
                'tools/test.py --out)')
    text = _text(head)
    if text is not None:
        return _text_problem(path, text)
    return (f'it is not a PyTorch checkpoint (unknown format; its first bytes are '
            f'{head[:8].hex(" ")})')


def _raise(path: str, problem: str, what: str, log: bool,
           cause: Optional[BaseException] = None):
    err = CheckpointFileError(path, problem, what)
    if log:
        from mmengine.logging import MMLogger
        MMLogger.get_current_instance().error(f'{type(err).__name__}: {err}')
    raise err from cause


def check_checkpoint_file(path: str, what: str = 'checkpoint', log: bool = False) -> None:
    """Raise :class:`CheckpointFileError` when :func:`checkpoint_file_problem` finds one
    (``log``: also log its message as an error first)."""
    problem = checkpoint_file_problem(path)
    if problem is not None:
        _raise(path, problem, what, log)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f'{type(err).__name__}: {text[0] if text else ""}'


def _torch_load(path: str, map_location, weights_only: Optional[bool]):
    try:
        from mmengine.runner.checkpoint import _safe_torch_load
    except ImportError:  # an mmengine without it: torch.load's own default
        import torch
        kwargs = {} if weights_only is None else dict(weights_only=weights_only)
        return torch.load(path, map_location=map_location, **kwargs)
    return _safe_torch_load(path, map_location=map_location, weights_only=weights_only)


def read_checkpoint(path: str, map_location='cpu', weights_only: Optional[bool] = None,
                    what: str = 'checkpoint', log: bool = True):
    """``torch.load`` of a checkpoint file, with a one-line error naming it when it cannot be.

    Args:
        path (str): the file (``~`` is expanded).
        map_location: as for ``torch.load``. Defaults to 'cpu'.
        weights_only (bool, optional): as for ``torch.load``; None: mmengine's choice (tensors
            and the types mmengine saves, else a full unpickling with a warning). Official
            checkpoints holding ``argparse.Namespace`` objects need False (trusted files only).
        what (str): what the file is, for the message. Defaults to 'checkpoint'.
        log (bool): also log the message as an error when raising (a tool that prints it
            itself passes False). Defaults to True.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointFileError: the file is empty, truncated, a text / config / other file, or
            ``torch.load`` fails on it; the one-line message names ``path`` and the problem.
    """
    path = osp.expanduser(path)
    if not osp.isfile(path) and not osp.isdir(path):
        raise FileNotFoundError(f'{what} not found: {path}')
    check_checkpoint_file(path, what, log)
    try:
        return _torch_load(path, map_location, weights_only)
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: BLE001 - any failure of torch.load on this file
        size = os.path.getsize(path)
        _raise(path, f'torch.load failed ({size} bytes; damaged or not a checkpoint): '
               f'{_first_line(err)}', what, log, err)


def last_good_checkpoint(folder: str, exclude: str = '') -> Optional[str]:
    """The newest ``*.pth`` file in ``folder`` (by modification time; not ``exclude`` nor a
    hidden scratch file) in which :func:`checkpoint_file_problem` finds nothing, or None."""
    if not osp.isdir(folder):
        return None
    files = [osp.join(folder, f) for f in os.listdir(folder)
             if f.endswith('.pth') and not f.startswith('.')]
    files = [f for f in files if osp.isfile(f) and not (
        exclude and osp.exists(exclude) and osp.samefile(f, exclude))]
    for path in sorted(files, key=osp.getmtime, reverse=True):
        if checkpoint_file_problem(path) is None:
            return path
    return None


def load_from_local(filename: str, map_location=None):
    """mmengine's local-file scheme of ``CheckpointLoader``, through :func:`read_checkpoint`."""
    return read_checkpoint(filename, map_location=map_location)


def register_with_mmengine() -> None:
    """Make :func:`read_checkpoint` the loader of local files for mmengine's
    ``CheckpointLoader`` (``Runner.resume`` / ``load_checkpoint``, ``Pretrained``); other
    schemes (``http://``, ``s3://``, ...) keep theirs."""
    from mmengine.runner.checkpoint import CheckpointLoader
    CheckpointLoader.register_scheme(prefixes='', loader=load_from_local, force=True)


register_with_mmengine()
