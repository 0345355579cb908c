"""The code sandbox's seccomp filter: system calls that untrusted code never needs.

Standard library only (loaded by :mod:`.harness`, which runs
with ``python -I -S``). A classic-BPF program (``seccomp(2)``, ``SECCOMP_MODE_FILTER``)
checked by the kernel on every system call of the process and everything it starts;
filters only stack, so nothing the code does later can remove it. Denied calls fail with
``EPERM`` (``clone3`` with ``ENOSYS``, so that the C library falls back to ``clone``,
whose flags a filter can see), never kill: a program that probes them keeps running
and is scored on what it prints or returns.

What it denies (:data:`DENIED`), by what it would reach:

* namespaces and mounts: ``unshare``, ``setns``, ``clone`` with any ``CLONE_NEW*`` flag,
  ``mount`` and the new mount API, ``pivot_root``, ``chroot``;
* other processes: ``ptrace``, ``process_vm_readv/writev``, ``kcmp``, ``pidfd_getfd``;
* kernel interfaces a program has no use for: ``keyctl``/``add_key``/``request_key``,
  ``perf_event_open``, ``bpf``, ``userfaultfd``, ``io_uring_*`` (whose operations
  bypass the filter), modules, ``kexec``, ``reboot``, swap, ``syslog``, ``acct``,
  quotas, file handles (``open_by_handle_at``), ``fanotify_init``;
* the host's page cache, which every run shares (the interpreter, the standard library):
  a run could clear a page of a read-only file and a later run read whether it is
  cached, one bit of memory across runs per page. So the probes are refused: ``mincore``,
  ``cachestat``, reads and writes with ``RWF_NOWAIT`` (``preadv2``/``pwritev2``, which fail
  with ``EAGAIN`` when the page is not cached), Linux AIO (``io_setup``, ``io_submit``: its
  requests carry the same flag); and the evictions: ``fadvise64`` (``posix_fadvise``,
  ``POSIX_FADV_DONTNEED`` among its advice), ``process_madvise`` and ``madvise`` with
  ``MADV_PAGEOUT``, ``MADV_COLD`` or ``MADV_REMOVE`` (the advice a memory allocator uses,
  such as ``MADV_DONTNEED`` on its own anonymous memory, stays allowed). This narrows the
  channel, it does not close it: timing (a cached page reads faster) and the present bits
  of ``/proc/self/pagemap`` after a fault that maps the cached neighbours of a page are
  no system calls to refuse;
* system calls of another ABI (i386 on x86_64, x32).

With ``protect_pid`` (the test process of a two-process assert run,
:mod:`.judge_side`) it also refuses every way to signal that
process: ``kill`` of it, of its own process group (``pid == 0``: the two share one), of
any group or of every process (``pid < 0``),
``tkill``/``tgkill``/``rt_(tg)sigqueueinfo`` of it, ``pidfd_open`` of it,
``pidfd_send_signal`` altogether (a ``/proc/<pid>`` descriptor is a pidfd too) and
making it the owner of a descriptor's ``SIGIO`` (``fcntl F_SETOWN[_EX]``, ``ioctl
FIOSETOWN/SIOCSPGRP``); and every way to change its limits or its scheduling where the two
share a uid (a trainer that is not root): ``prlimit64`` of it (``RLIMIT_FSIZE=0`` in a race
with its first write made it fail), ``sched_setaffinity`` / ``sched_setscheduler`` /
``sched_setparam`` / ``sched_setattr`` of it, ``setpriority`` and ``ioprio_set`` of it or
of any group or user (the two share a process group).

Supported on x86_64 and aarch64 (:func:`supported`); elsewhere the sandbox runs without
it and says so.
"""

import os
import struct

__all__ = ['DENIED', 'apply_filter', 'build_filter', 'supported']

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
_NR, _ARCH = 0, 4


def _arg_low(i: int) -> int:
    """Offset of the low 32 bits of argument ``i`` (little-endian machines)."""
    return 16 + 8 * i


_AUDIT_ARCH = {'x86_64': 0xC000003E, 'aarch64': 0xC00000B7}
_X32_BIT = 0x40000000
#: name -> (x86_64 number, aarch64 number); the syscall tables of both ABIs
#: (asm/unistd_64.h, asm-generic/unistd.h).
_NUMBERS = {
    'unshare': (272, 97), 'setns': (308, 268), 'mount': (165, 40), 'umount2': (166, 39),
    'pivot_root': (155, 41), 'chroot': (161, 51), 'open_tree': (428, 428),
    'move_mount': (429, 429), 'fsopen': (430, 430), 'fsconfig': (431, 431),
    'fsmount': (432, 432), 'fspick': (433, 433), 'mount_setattr': (442, 442),
    'keyctl': (250, 219), 'add_key': (248, 217), 'request_key': (249, 218),
    'ptrace': (101, 117), 'process_vm_readv': (310, 270), 'process_vm_writev': (311, 271),
    'kcmp': (312, 272), 'pidfd_getfd': (438, 438), 'perf_event_open': (298, 241),
    'bpf': (321, 280), 'userfaultfd': (323, 282), 'io_uring_setup': (425, 425),
    'io_uring_enter': (426, 426), 'io_uring_register': (427, 427),
    'kexec_load': (246, 104), 'kexec_file_load': (320, 294), 'init_module': (175, 105),
    'finit_module': (313, 273), 'delete_module': (176, 106), 'reboot': (169, 142),
    'swapon': (167, 224), 'swapoff': (168, 225), 'syslog': (103, 116), 'acct': (163, 89),
    'quotactl': (179, 60), 'quotactl_fd': (443, 443), 'open_by_handle_at': (304, 265),
    'name_to_handle_at': (303, 264), 'lookup_dcookie': (212, 18),
    'fanotify_init': (300, 262), 'mincore': (27, 232), 'cachestat': (451, 451),
    'fadvise64': (221, 223), 'io_setup': (206, 0), 'io_submit': (209, 2),
    'process_madvise': (440, 440),
    # checked by argument
    'clone': (56, 220), 'clone3': (435, 435), 'kill': (62, 129), 'tkill': (200, 130),
    'tgkill': (234, 131), 'rt_sigqueueinfo': (129, 138), 'rt_tgsigqueueinfo': (297, 240),
    'pidfd_send_signal': (424, 424), 'pidfd_open': (434, 434), 'fcntl': (72, 25),
    'ioctl': (16, 29), 'preadv2': (327, 286), 'pwritev2': (328, 287), 'madvise': (28, 233),
    'prlimit64': (302, 261), 'sched_setaffinity': (203, 122), 'sched_setscheduler': (144, 119),
    'sched_setparam': (142, 118), 'sched_setattr': (314, 274), 'setpriority': (141, 140),
    'ioprio_set': (251, 30),
}
_X86_ONLY = {'iopl': 172, 'ioperm': 173}
#: Denied whatever their arguments.
DENIED = ('unshare', 'setns', 'mount', 'umount2', 'pivot_root', 'chroot', 'open_tree',
          'move_mount', 'fsopen', 'fsconfig', 'fsmount', 'fspick', 'mount_setattr', 'keyctl',
          'add_key', 'request_key', 'ptrace', 'process_vm_readv', 'process_vm_writev', 'kcmp',
          'pidfd_getfd', 'perf_event_open', 'bpf', 'userfaultfd', 'io_uring_setup',
          'io_uring_enter', 'io_uring_register', 'kexec_load', 'kexec_file_load', 'init_module',
          'finit_module', 'delete_module', 'reboot', 'swapon', 'swapoff', 'syslog', 'acct',
          'quotactl', 'quotactl_fd', 'open_by_handle_at', 'name_to_handle_at',
          'lookup_dcookie', 'fanotify_init', 'mincore', 'cachestat', 'fadvise64', 'io_setup',
          'io_submit', 'process_madvise')
# CLONE_NEWTIME | CLONE_NEWNS | CLONE_NEWCGROUP | UTS | IPC | USER | PID | NET
_CLONE_NEW_MASK = 0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 \
    | 0x10000000 | 0x20000000 | 0x40000000
_F_SETOWN, _F_SETOWN_EX = 8, 15
_RWF_NOWAIT = 0x00000008
_PRIO_PROCESS, _IOPRIO_WHO_PROCESS = 0, 1
# MADV_REMOVE, MADV_COLD, MADV_PAGEOUT: what evicts or deactivates pages of a file
_MADV_EVICT = (9, 20, 21)
_FIOSETOWN, _SIOCSPGRP = 0x8901, 0x8902

# classic BPF opcodes
_LD_ABS = 0x20      # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15         # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35         # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45        # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06         # BPF_RET | BPF_K
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_EPERM, _ENOSYS = 1, 38


def supported() -> str | None:
    """None if this machine's architecture has a filter here, else why not."""
    machine = os.uname().machine
    if machine not in _AUDIT_ARCH:
        return f'no seccomp filter for the {machine} architecture (x86_64 and aarch64 only)'
    if struct.pack('=I', 1) != struct.pack('<I', 1):
        return 'a big-endian machine (the filter reads arguments little-endian)'
    return None


class _Program:
    """A tiny assembler: instructions with symbolic jump targets, resolved at the end."""

    def __init__(self) -> None:
        self.code: list[tuple[int, object, object, int]] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def load(self, offset: int) -> None:
        self.code.append((_LD_ABS, 0, 0, offset))

    def jump(self, op: int, k: int, true: str | int = 0, false: str | int = 0) -> None:
        """``true``/``false``: a label, or 0 for the next instruction."""
        self.code.append((op, true, false, k))

    def ret(self, value: int) -> None:
        self.code.append((_RET, 0, 0, value))

    def assemble(self) -> bytes:
        out = []
        for i, (op, jt, jf, k) in enumerate(self.code):
            offsets = []
            for target in (jt, jf):
                offset = target if isinstance(target, int) else self.labels[target] - i - 1
                if not 0 <= offset <= 255:
                    raise ValueError(f'seccomp filter: jump of {offset} at {i}')
                offsets.append(offset)
            out.append(struct.pack('=HBBI', op, offsets[0], offsets[1], k & 0xFFFFFFFF))
        return b''.join(out)


def build_filter(machine: str | None = None, protect_pid: int | None = None) -> bytes:
    """The filter as ``struct sock_filter`` instructions (8 bytes each).

    Args:
        machine: ``'x86_64'`` or ``'aarch64'`` (default: this machine's).
        protect_pid: a process this one must not signal (see the module docstring).

    Returns:
        The instructions, ready for ``struct sock_fprog``.
    """
    machine = machine or os.uname().machine
    column = ('x86_64', 'aarch64').index(machine)
    nr = {name: numbers[column] for name, numbers in _NUMBERS.items()}
    p = _Program()
    p.load(_ARCH)
    p.jump(_JEQ, _AUDIT_ARCH[machine], 0, 'eperm')  # a call of another ABI
    p.load(_NR)
    if machine == 'x86_64':
        p.jump(_JGE, _X32_BIT, 'eperm')  # the x32 ABI
    denied = [nr[name] for name in DENIED]
    if machine == 'x86_64':
        denied += list(_X86_ONLY.values())
    for number in denied:
        p.jump(_JEQ, number, 'eperm')
    p.jump(_JEQ, nr['clone3'], 'enosys')
    p.jump(_JEQ, nr['clone'], 'clone')
    p.jump(_JEQ, nr['preadv2'], 'rwf')
    p.jump(_JEQ, nr['pwritev2'], 'rwf')
    p.jump(_JEQ, nr['madvise'], 'madvise')
    if protect_pid is not None:
        p.jump(_JEQ, nr['kill'], 'kill')
        for name in ('tkill', 'rt_sigqueueinfo', 'pidfd_open', 'prlimit64', 'sched_setaffinity',
                     'sched_setscheduler', 'sched_setparam', 'sched_setattr'):
            p.jump(_JEQ, nr[name], 'arg0')
        p.jump(_JEQ, nr['setpriority'], 'setpriority')
        p.jump(_JEQ, nr['ioprio_set'], 'ioprio_set')
        for name in ('tgkill', 'rt_tgsigqueueinfo'):
            p.jump(_JEQ, nr[name], 'arg01')
        p.jump(_JEQ, nr['pidfd_send_signal'], 'eperm')
        p.jump(_JEQ, nr['fcntl'], 'fcntl')
        p.jump(_JEQ, nr['ioctl'], 'ioctl')
    p.ret(_RET_ALLOW)
    p.label('clone')
    p.load(_arg_low(0))
    p.jump(_JSET, _CLONE_NEW_MASK, 'eperm')
    p.ret(_RET_ALLOW)
    p.label('rwf')  # preadv2/pwritev2(fd, iov, iovcnt, pos_l, pos_h, flags)
    p.load(_arg_low(5))
    p.jump(_JSET, _RWF_NOWAIT, 'eperm')
    p.ret(_RET_ALLOW)
    p.label('madvise')  # madvise(addr, length, advice)
    p.load(_arg_low(2))
    for advice in _MADV_EVICT:
        p.jump(_JEQ, advice, 'eperm')
    p.ret(_RET_ALLOW)
    if protect_pid is not None:
        p.label('kill')  # kill(pid, sig): the process, its own group (0), a group (< 0), all (-1)
        p.load(_arg_low(0))
        p.jump(_JEQ, 0, 'eperm')
        p.jump(_JSET, 0x80000000, 'eperm')
        p.jump(_JEQ, protect_pid, 'eperm')
        p.ret(_RET_ALLOW)
        p.label('arg01')
        p.load(_arg_low(1))
        p.jump(_JEQ, protect_pid, 'eperm')
        p.label('arg0')
        p.load(_arg_low(0))
        p.jump(_JEQ, protect_pid, 'eperm')
        p.ret(_RET_ALLOW)
        # setpriority / ioprio_set(which, who, ...): one process, never the judge, no group
        # or user (the two share a process group and, for a non-root trainer, a uid)
        p.label('setpriority')
        p.load(_arg_low(0))
        p.jump(_JEQ, _PRIO_PROCESS, 'who', 'eperm')
        p.label('ioprio_set')
        p.load(_arg_low(0))
        p.jump(_JEQ, _IOPRIO_WHO_PROCESS, 'who', 'eperm')
        p.label('who')
        p.load(_arg_low(1))
        p.jump(_JEQ, protect_pid, 'eperm')
        p.ret(_RET_ALLOW)
        p.label('fcntl')
        p.load(_arg_low(1))
        p.jump(_JEQ, _F_SETOWN, 'eperm')
        p.jump(_JEQ, _F_SETOWN_EX, 'eperm')
        p.ret(_RET_ALLOW)
        p.label('ioctl')
        p.load(_arg_low(1))
        p.jump(_JEQ, _FIOSETOWN, 'eperm')
        p.jump(_JEQ, _SIOCSPGRP, 'eperm')
        p.ret(_RET_ALLOW)
    p.label('eperm')
    p.ret(_RET_ERRNO | _EPERM)
    p.label('enosys')
    p.ret(_RET_ERRNO | _ENOSYS)
    return p.assemble()


_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


def apply_filter(protect_pid: int | None = None) -> None:
    """Installs :func:`build_filter`'s filter on this process (and all it starts).

    Sets ``no_new_privs`` first (the kernel requires it of an unprivileged process).

    Raises:
        OSError: the architecture is unsupported or the kernel refused the filter.
    """
    why = supported()
    if why is not None:
        raise OSError(why)
    import ctypes  # noqa: PLC0415  (the harness forgets it before the code runs)
    code = build_filter(protect_pid=protect_pid)

    class SockFprog(ctypes.Structure):
        _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_void_p)]

    buffer = ctypes.create_string_buffer(code, len(code))
    prog = SockFprog(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), 'prctl(PR_SET_NO_NEW_PRIVS) failed')
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f'the kernel refused the seccomp filter: {os.strerror(errno)}')
