# Runs a command on a pseudo-terminal (its stdin, stdout and stderr all the terminal, as
# for a person at a shell), answers the prompts it shows, and prints the whole transcript.
# Each rule answers the first prompt that contains its text, once; prompts may come in any
# order. Exits with the command's status, or 99 when a rule was never used.
#
# usage: python pty_driver.py RULES_JSON CMD ARGS...   (RULES_JSON: [["prompt text", "answer"], ...])
# The answer "<SIGINT>" is the person pressing Ctrl-C: SIGINT to the command's process group,
# as the terminal sends it to its foreground group.
# PTY_COLUMNS in the environment sets the terminal's width (else the kernel's 0 columns).
import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time

rules = json.loads(sys.argv[1])
master, slave = pty.openpty()
if os.environ.get("PTY_COLUMNS"):
    size = struct.pack("HHHH", 24, int(os.environ["PTY_COLUMNS"]), 0, 0)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
proc = subprocess.Popen(sys.argv[2:], stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
os.close(slave)
out = b""
seen = 0
deadline = time.time() + 60
while time.time() < deadline:
    ready, _, _ = select.select([master], [], [], 0.1)
    if ready:
        try:
            data = os.read(master, 4096)
        except OSError:
            data = b""
        if not data:
            break
        out += data
    # The earliest unanswered prompt in what came since the last answer.
    found = None
    for i, (prompt, answer) in enumerate(rules):
        at = out.find(prompt.encode(), seen)
        if at >= 0 and (found is None or at < found[0]):
            found = (at, i)
    if found is not None:
        at, i = found
        prompt, answer = rules.pop(i)
        seen = at + len(prompt)
        if answer == "<SIGINT>":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.write(master, (answer + "\n").encode())
    elif not ready and proc.poll() is not None:
        break
try:
    proc.wait(timeout=10)
except subprocess.TimeoutExpired:
    proc.kill()
print(out.decode(errors="replace"))
if rules:
    print(f"pty_driver: prompts never shown: {rules}", file=sys.stderr)
    sys.exit(99)
sys.exit(proc.returncode)
