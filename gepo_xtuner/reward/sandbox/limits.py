"""Kernel limits, privileges and Landlock: what the sandboxed processes do to themselves.

Used by :mod:`.harness` before the fork, and after it by the solution's process
(:mod:`.solution_side`) and the test process (:mod:`.judge_side`). Standard library only
(``python -I -S``). Every limit is set hard == soft, so code that runs later cannot raise it.
"""

import builtins
import os
import resource
import sys

#: Flags of an ``open`` that writes (the file guard and the test process's trace).
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

# Landlock (Linux >= 5.13): syscall numbers are shared by every architecture.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_PR_SET_NO_NEW_PRIVS = 38
_RULE_PATH_BENEATH = 1
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 14, 1 << 15
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


def _fs_access_mask(abi: int) -> int:
    """Every file-system right Landlock ABI ``abi`` knows (13 in v1, +REFER, +TRUNCATE, +IOCTL_DEV)."""
    bits = 13 + (abi >= 2) + (abi >= 3) + (abi >= 5)
    return (1 << bits) - 1


def _landlock_syscalls():
    import ctypes  # noqa: PLC0415  (only here: see apply_landlock)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return ctypes, libc


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 if Landlock is unavailable (old kernel,
    not enabled at boot, or the syscall filtered by a container's seccomp profile)."""
    try:
        ctypes, libc = _landlock_syscalls()
    except (ImportError, OSError):
        return 0
    version = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(0, int(version))


def apply_landlock(read: list[str], write: list[str], read_files: list[str],
                   rw_files: list[str], block_tcp: bool) -> int:
    """Restricts this process (and everything it starts) with Landlock.

    Afterwards it can read and execute only under ``read`` and ``read_files``, read and
    write only under ``write`` and ``rw_files``; everything else of the file system is
    refused by the kernel (listing, reading, writing, creating, deleting, renaming,
    linking). With ABI >= 4 and ``block_tcp``, TCP bind and connect are refused; with
    ABI >= 6 signals to and abstract UNIX sockets of processes outside the sandbox are.
    Paths that do not exist are skipped.

    Returns:
        The ABI version used.

    Raises:
        OSError: Landlock is unavailable or a call failed.
    """
    ctypes, libc = _landlock_syscalls()
    abi = int(libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))
    if abi < 1:
        raise OSError(ctypes.get_errno(), 'Landlock is unavailable')

    class RulesetAttr(ctypes.Structure):
        _fields_ = [('handled_access_fs', ctypes.c_uint64), ('handled_access_net', ctypes.c_uint64),
                    ('scoped', ctypes.c_uint64)]

    class PathBeneathAttr(ctypes.Structure):
        _pack_ = 1
        _fields_ = [('allowed_access', ctypes.c_uint64), ('parent_fd', ctypes.c_int32)]

    handled = _fs_access_mask(abi)
    attr = RulesetAttr(handled, 3 if (abi >= 4 and block_tcp) else 0,
                       (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)  # the struct grew with the ABI
    ruleset = int(libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                               ctypes.c_uint32(0)))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), 'landlock_create_ruleset failed')
    file_rights = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
    read_rights = (_FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR) & handled
    rules = ([(p, read_rights) for p in read] + [(p, handled) for p in write]
             + [(p, (_FS_EXECUTE | _FS_READ_FILE) & handled) for p in read_files]
             + [(p, (_FS_READ_FILE | _FS_WRITE_FILE | _FS_IOCTL_DEV) & handled & file_rights)
                for p in rw_files])
    try:
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not os.path.isdir(path):
                    rights &= file_rights  # only file rights apply to a file
                rule = PathBeneathAttr(rights, fd)
                if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    raise OSError(ctypes.get_errno(), f'landlock_add_rule failed for {path}')
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), 'prctl(PR_SET_NO_NEW_PRIVS) failed')
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), 'landlock_restrict_self failed')
    finally:
        os.close(ruleset)
    return abi


def set_limit(kind: int, soft: int, hard: int | None = None) -> None:
    resource.setrlimit(kind, (soft, soft if hard is None else hard))


def _exit(code: object = None) -> None:
    """``exit()`` / ``quit()`` (``site`` defines them; the harness runs without it)."""
    raise SystemExit(code)


def join_cgroups(fds: list[int]) -> None:
    """Moves this process into the cgroups whose ``cgroup.procs`` files ``fds`` are.

    The parent opened the files (as root, outside the sandbox, where ``/sys/fs/cgroup``
    is not mounted); the kernel checks the opener's credentials, so writing ``0`` (this
    process) works here too. Everything the code starts is then counted and limited
    there (``pids.max``, the memory limit). The descriptors are closed afterwards.
    """
    for fd in fds:
        try:
            os.write(fd, b'0')
        finally:
            os.close(fd)


def _no_new_privs() -> None:
    ctypes, libc = _landlock_syscalls()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), 'prctl(PR_SET_NO_NEW_PRIVS) failed')


def drop_privileges(uid: int, gid: int, own: list[str]) -> None:
    """Becomes the unprivileged ``uid``/``gid`` for good (root only).

    ``own`` (the working directory) is given to that user first. Afterwards the process
    has no capabilities, no supplementary groups, real = effective = saved ids, and
    cannot gain privileges again (no_new_privs: setuid programs do not elevate).
    Checked: a ``setuid(0)`` must fail, else this raises.
    """
    for path in own:
        os.chown(path, uid, gid)
    _no_new_privs()
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise OSError('the sandbox could not drop its privileges')
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise OSError('the sandbox regained root after dropping it')


_PR_SET_DUMPABLE = 4


def set_dumpable(on: bool) -> None:
    """Non-dumpable: processes of the same user can neither trace this one nor read its
    memory, descriptors or environment under /proc (the kernel's ptrace access check)."""
    ctypes, libc = _landlock_syscalls()
    if libc.prctl(_PR_SET_DUMPABLE, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), 'prctl(PR_SET_DUMPABLE) failed')


def forget_ctypes() -> None:
    """ctypes was needed for the syscalls; forget it so that a later ``import ctypes`` by
    the code is a real import (and meets the guard's import check where one is)."""
    for name in ('ctypes', 'ctypes._endian', '_ctypes'):
        sys.modules.pop(name, None)


def last_steps(spec: dict) -> None:
    """What every process that runs the code does last: the address-space limit, the
    interpreter's site directories, ``exit``/``quit``."""
    forget_ctypes()
    set_limit(resource.RLIMIT_AS, spec['memory_bytes'])
    sys.path.extend(spec.get('site_dirs', []))
    builtins.exit = builtins.quit = _exit
