"""tests/bench/send_profile.py's attribution: perf samples by layer, py-spy samples by our part."""

from __future__ import annotations

from tests.bench.send_profile import gil_parts, layers_of

LOOP = 4242
KERNEL = "[kernel.kallsyms]"
CYGRPC = "/venv/grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so"

PERF_SCRIPT = f"""python  {LOOP}
\t  ffffffff8200e45b tcp_sendmsg ({KERNEL})
\t  ffffffff821ecc51 do_syscall_64 ({KERNEL})
\t  ffffffff81000130 entry_SYSCALL_64_after_hwframe ({KERNEL})
\t            10ac4d __libc_sendmsg (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t            51a319 [unknown] ({CYGRPC})

python  {LOOP}
\t  ffffffff81e2c2ec eventfd_write ({KERNEL})
\t  ffffffff821ecc51 do_syscall_64 ({KERNEL})
\t            11cc4d __GI___libc_write (/usr/lib/x86_64-linux-gnu/libc.so.6)

python  {LOOP}
\t  ffffffff81407c3d __rcu_read_unlock ({KERNEL})
\t  ffffffff81dac488 asm_sysvec_apic_timer_interrupt ({KERNEL})

python  {LOOP}
\t            158b92 PyObject_Vectorcall (/usr/lib/libpython3.11.so.1.0)

event_engine  4250
\t            571ef4 [unknown] ({CYGRPC})

python  4251
\t            139c40 PyBuffer_Release (/usr/lib/libpython3.11.so.1.0)
"""


def test_perf_samples_go_to_the_loop_threads_syscalls_user_space_or_their_thread() -> None:
    layers, total = layers_of(PERF_SCRIPT, LOOP)
    assert total == 6
    assert layers == {
        "kernel: sendmsg (writing responses)": 1,
        "kernel: eventfd writes (waking gRPC's pollers)": 1,
        "kernel: interrupts, scheduling, other": 1,
        "loop: user": 1,
        "event_engine": 1,
        "other Python threads": 1,
    }


LOOP_ROOT = "<module> (sluice/main.py:120);serve (processes/runtime.py:51);Runner.run (asyncio/runners.py:118)"
PY_SPY_RAW = "\n".join([
    f"{LOOP_ROOT};Edge._unary.<locals>.call (proxy/grpc/edge.py:130);count_in (common/metrics.py:181);"
    "Counter.inc (prometheus_client/metrics.py:300) 3",
    f"{LOOP_ROOT};Edge._unary.<locals>.call (proxy/grpc/edge.py:130);"
    "Dispatcher.dispatch (broker/store/dispatcher.py:248);wait_for (asyncio/tasks.py:427) 2",
    f"{LOOP_ROOT} 5",  # gRPC's Cython and the event loop: no frame of ours
    "Thread._bootstrap (threading.py:1002);CommitLogWriter._flush_loop (broker/store/writer.py:707) 7",
])  # fmt: skip


def test_py_spy_samples_of_the_loop_thread_are_split_by_our_innermost_part() -> None:
    parts, total = gil_parts(PY_SPY_RAW)
    assert total == 10  # the writer thread's samples are not the loop thread's
    assert parts == {"metrics (prometheus_client)": 3, "broker: dispatch, message-id index (RocksDB)": 2}
