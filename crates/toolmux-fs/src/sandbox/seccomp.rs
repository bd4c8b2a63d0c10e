//! A seccomp filter that completes `network: false`: Landlock denies TCP bind and connect
//! only, so UDP (DNS included), ICMP and every other address family stayed open to a
//! command that was told it had no network. The filter lets `socket(2)` create Unix
//! sockets and nothing else, and makes `io_uring_setup(2)` unavailable, since a ring
//! creates sockets with no system call a filter sees.
//!
//! Classic BPF over `struct seccomp_data`, built in the parent and installed by the child
//! between fork and exec (after `no_new_privs`, which the kernel requires of an
//! unprivileged filter). A system call of another architecture (a 32-bit `int 0x80` on
//! x86-64, or x32's numbers) fails with `ENOSYS`: its socket calls have other numbers
//! (`socketcall`), and no program a command runs here needs them.

// `seccomp(2)` and `prctl(PR_SET_SECCOMP)` take pointers; every `unsafe` block says why it
// holds.
#![allow(unsafe_code)]

use std::io;

/// Whether this kernel can install the filter; the error says why not.
pub(super) fn available() -> Result<(), String> {
    use std::sync::OnceLock;
    static AVAILABLE: OnceLock<Result<(), String>> = OnceLock::new();
    AVAILABLE.get_or_init(probe).clone()
}

fn probe() -> Result<(), String> {
    let action: u32 = RET_ERRNO;
    // SAFETY: SECCOMP_GET_ACTION_AVAIL reads one `u32` from the pointer, which lives across
    // the call; nothing is installed.
    let done = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_ACTION_AVAIL,
            0 as std::ffi::c_uint,
            &raw const action,
        )
    };
    if done == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    Err(match err.raw_os_error() {
        Some(libc::ENOSYS | libc::EINVAL) => {
            "this kernel has no seccomp filters (it needs CONFIG_SECCOMP_FILTER)".to_owned()
        }
        _ => format!("probing seccomp failed: {err}"),
    })
}

/// `struct sock_filter`: one classic BPF instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
struct Instruction {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

/// `struct sock_fprog`.
#[repr(C)]
struct Program {
    len: std::ffi::c_ushort,
    filter: *const Instruction,
}

// Instruction classes and modes (`linux/bpf_common.h`).
/// `BPF_LD | BPF_W | BPF_ABS` (the first two are 0).
const LOAD_WORD_ABSOLUTE: u16 = 0x20;
const JUMP_IF_EQUAL: u16 = 0x05 | 0x10; // BPF_JMP | BPF_JEQ | BPF_K
const JUMP_IF_AT_LEAST: u16 = 0x05 | 0x30; // BPF_JMP | BPF_JGE | BPF_K
const RETURN: u16 = 0x06; // BPF_RET | BPF_K

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;

// Offsets into `struct seccomp_data { int nr; u32 arch; u64 ip; u64 args[6]; }`.
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
/// The low half of `args[0]` on a little-endian machine (`socket`'s domain is an `int`).
const OFFSET_ARG0: u32 = 16;

/// `AUDIT_ARCH_*` of the architecture this is built for.
#[cfg(target_arch = "x86_64")]
const ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const ARCH: u32 = 0xc000_00b7;
/// x32's system calls are x86-64's numbers with this bit set, under the same `arch`.
#[cfg(target_arch = "x86_64")]
const X32_BIT: Option<u32> = Some(0x4000_0000);
#[cfg(target_arch = "aarch64")]
const X32_BIT: Option<u32> = None;

const NR_SOCKET: u32 = libc::SYS_socket as u32;
const NR_IO_URING_SETUP: u32 = libc::SYS_io_uring_setup as u32;

/// The filter of `network: false`, ready for a child to install.
#[derive(Debug)]
pub(super) struct Filter {
    instructions: Box<[Instruction]>,
}

impl Filter {
    /// Sockets of the Unix family only, and no io_uring.
    pub(super) fn network() -> Filter {
        Filter::build(ARCH, X32_BIT, NR_SOCKET, NR_IO_URING_SETUP)
    }

    /// The program for an architecture `arch` whose `socket` and `io_uring_setup` have
    /// these numbers.
    fn build(arch: u32, x32_bit: Option<u32>, socket: u32, io_uring_setup: u32) -> Filter {
        let instruction = |code, k, jt, jf| Instruction { code, jt, jf, k };
        let errno = |errno: i32| instruction(RETURN, RET_ERRNO | errno as u32, 0, 0);
        let af_unix = libc::AF_UNIX as u32;
        // Jumps count the instructions they skip; the labels at the end are, from the
        // last: ALLOW, DENY_SOCKET (EACCES), NO_SUCH_CALL (ENOSYS).
        let mut program = vec![instruction(LOAD_WORD_ABSOLUTE, OFFSET_ARCH, 0, 0)];
        // Another architecture's calls: NO_SUCH_CALL. Its offset is patched below.
        program.push(instruction(JUMP_IF_EQUAL, arch, 0, 0));
        let arch_check = program.len() - 1;
        program.push(instruction(LOAD_WORD_ABSOLUTE, OFFSET_NR, 0, 0));
        let x32_check = x32_bit.map(|bit| {
            program.push(instruction(JUMP_IF_AT_LEAST, bit, 0, 0));
            program.len() - 1
        });
        program.push(instruction(JUMP_IF_EQUAL, socket, 0, 0));
        let socket_check = program.len() - 1;
        program.push(instruction(JUMP_IF_EQUAL, io_uring_setup, 0, 0));
        let io_uring_check = program.len() - 1;
        program.push(instruction(RETURN, RET_ALLOW, 0, 0));
        // socket(2): the domain decides.
        let socket_domain = program.len();
        program.push(instruction(LOAD_WORD_ABSOLUTE, OFFSET_ARG0, 0, 0));
        program.push(instruction(JUMP_IF_EQUAL, af_unix, 0, 0));
        let unix_check = program.len() - 1;
        let deny_socket = program.len();
        program.push(errno(libc::EACCES));
        let no_such_call = program.len();
        program.push(errno(libc::ENOSYS));
        let allow = program.len();
        program.push(instruction(RETURN, RET_ALLOW, 0, 0));

        // Offsets are relative to the instruction after the jump.
        let offset = |from: usize, to: usize| u8::try_from(to - from - 1).unwrap_or(u8::MAX);
        program[arch_check].jf = offset(arch_check, no_such_call);
        if let Some(at) = x32_check {
            program[at].jt = offset(at, no_such_call);
        }
        program[socket_check].jt = offset(socket_check, socket_domain);
        program[io_uring_check].jt = offset(io_uring_check, no_such_call);
        program[unix_check].jt = offset(unix_check, allow);
        program[unix_check].jf = offset(unix_check, deny_socket);
        Filter { instructions: program.into_boxed_slice() }
    }

    /// Installs the filter on the calling thread. Async-signal-safe: one system call on
    /// memory this filter owns, no allocation; `no_new_privs` must be set already.
    pub(super) fn install(&self) -> io::Result<()> {
        let program = Program {
            len: self.instructions.len() as std::ffi::c_ushort,
            filter: self.instructions.as_ptr(),
        };
        // SAFETY: `program` points at `len` valid instructions owned by `self`, which
        // outlives the call; the kernel copies the program before it returns.
        let done = unsafe {
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER as std::ffi::c_ulong,
                &raw const program,
                0 as std::ffi::c_ulong,
                0 as std::ffi::c_ulong,
            )
        };
        if done != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `filter` on one system call as the kernel would: what it returns.
    fn run(filter: &Filter, arch: u32, nr: u32, arg0: u32) -> u32 {
        let load = |k: u32| match k {
            OFFSET_NR => nr,
            OFFSET_ARCH => arch,
            OFFSET_ARG0 => arg0,
            _ => panic!("loads offset {k}"),
        };
        let mut pc = 0;
        let mut accumulator = 0;
        loop {
            let Instruction { code, jt, jf, k } = filter.instructions[pc];
            pc += 1;
            match code {
                LOAD_WORD_ABSOLUTE => accumulator = load(k),
                JUMP_IF_EQUAL => pc += usize::from(if accumulator == k { jt } else { jf }),
                JUMP_IF_AT_LEAST => pc += usize::from(if accumulator >= k { jt } else { jf }),
                RETURN => return k,
                _ => panic!("unknown instruction {code:#x}"),
            }
        }
    }

    const X86_64: u32 = 0xc000_003e;
    const I386: u32 = 0x4000_0003;

    #[test]
    fn only_unix_sockets_are_created_and_io_uring_is_missing() {
        // x86-64's numbers: socket 41, io_uring_setup 425, read 0.
        let filter = Filter::build(X86_64, Some(0x4000_0000), 41, 425);
        let eacces = RET_ERRNO | libc::EACCES as u32;
        let enosys = RET_ERRNO | libc::ENOSYS as u32;
        assert_eq!(run(&filter, X86_64, 41, libc::AF_UNIX as u32), RET_ALLOW);
        for domain in [libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK, libc::AF_PACKET, 40] {
            assert_eq!(run(&filter, X86_64, 41, domain as u32), eacces, "domain {domain}");
        }
        assert_eq!(run(&filter, X86_64, 425, 0), enosys);
        assert_eq!(run(&filter, X86_64, 0, libc::AF_INET as u32), RET_ALLOW);
        assert_eq!(run(&filter, X86_64, 42, libc::AF_INET as u32), RET_ALLOW, "connect");
        // x32's socket, and any 32-bit call.
        assert_eq!(run(&filter, X86_64, 0x4000_0000 + 41, libc::AF_INET as u32), enosys);
        assert_eq!(run(&filter, I386, 102, 1), enosys);
        // Without the x32 check (aarch64).
        let filter = Filter::build(0xc000_00b7, None, 198, 425);
        assert_eq!(run(&filter, 0xc000_00b7, 198, libc::AF_INET as u32), eacces);
        assert_eq!(run(&filter, 0xc000_00b7, 198, libc::AF_UNIX as u32), RET_ALLOW);
        assert_eq!(run(&filter, 0xc000_00b7, 0x4000_0000, 0), RET_ALLOW);
        assert_eq!(run(&filter, X86_64, 198, 0), enosys);
    }

    #[test]
    fn this_architecture_has_its_numbers() {
        let filter = Filter::network();
        assert_eq!(run(&filter, ARCH, NR_SOCKET, libc::AF_INET6 as u32), RET_ERRNO | 13);
        assert_eq!(run(&filter, ARCH, NR_SOCKET, libc::AF_UNIX as u32), RET_ALLOW);
    }
}
