#!/usr/bin/env python3
"""The helpers of the CI scripts: tools/test_plan.py against this build's introspection, and
tools/phase_times.sh's records.

Usage: ci_scripts_test.py BUILD_DIR
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
BUILD = None  # set from argv
# 1.2 s of CPU in a child process.
BUSY_LOOP = ('import time; t = time.process_time(); '
             '[0 for _ in iter(lambda: time.process_time() - t < 1.2, False)]')


def introspect(what):
    out = subprocess.run(['meson', 'introspect', BUILD, what], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)


def plan(*args):
    """(tests, targets) that tools/test_plan.py prints for args."""
    run = subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'test_plan.py'), BUILD,
                          *args], check=True, capture_output=True, text=True)
    tests, targets = [], []
    for line in run.stdout.splitlines():
        kind, _, value = line.partition(' ')
        {'test': tests, 'target': targets}[kind].append(value)
    return tests, targets


class TestPlanTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tests = introspect('--tests')
        cls.files = {t['id']: [os.path.relpath(f, BUILD) for f in t['filename']]
                     for t in introspect('--targets')}

    def in_suites(self, suites):
        return [t for t in self.tests if {'engramd:' + s for s in suites} & set(t['suite'])]

    def test_lists_every_test_of_the_suites_and_every_target_they_depend_on(self):
        for suites in (['table'], ['daemon', 'ops']):
            tests, targets = plan(*suites)
            wanted = self.in_suites(suites)
            self.assertTrue(wanted, suites)
            self.assertEqual(sorted(tests), sorted(t['name'] for t in wanted))
            needed = {f for t in wanted for dep in t['depends'] for f in self.files[dep]}
            self.assertEqual(set(targets), needed)
            self.assertEqual(targets, sorted(targets))

    def test_in_process_leaves_out_python_and_libfuzzer_runs(self):
        suites = ['daemon', 'hash', 'gather', 'store', 'ops', 'chaos']
        tests, _ = plan('--in-process', *suites)
        everything, _ = plan(*suites)
        left_out = set(everything) - set(tests)
        for t in self.in_suites(suites):
            program = os.path.basename(t['cmd'][0])
            out_of_process = program.startswith('python') or program == 'run_fuzz.sh'
            self.assertEqual(t['name'] in left_out, out_of_process, t['name'])
        self.assertTrue(tests)

    def test_without_suites_it_prints_its_usage_and_fails(self):
        run = subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'test_plan.py'), BUILD],
                             capture_output=True, text=True)
        self.assertEqual(run.returncode, 2)
        self.assertIn('test_plan.py BUILD_DIR', run.stderr)


class PhaseTimesTest(unittest.TestCase):
    def test_records_wall_and_cpu_seconds_of_each_phase(self):
        with tempfile.TemporaryDirectory() as tmp:
            times = os.path.join(tmp, 'phases.tsv')
            script = f'''
                source {os.path.join(ROOT, 'tools', 'phase_times.sh')}
                phase_start
                {sys.executable} -c "{BUSY_LOOP}"
                phase_end "busy phase"
                sleep 1.2
                phase_end "idle phase"
                echo done
            '''
            run = subprocess.run(['bash', '-c', script], capture_output=True, text=True,
                                 env=dict(os.environ, ENGRAM_PHASE_TIMES=times))
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertEqual(run.stdout, 'done\n')
            with open(times) as f:
                rows = [line.rstrip('\n').split('\t') for line in f]
            self.assertEqual([r[0] for r in rows], ['busy phase', 'idle phase'])
            (busy_wall, busy_cpu), (idle_wall, idle_cpu) = [map(int, r[1:]) for r in rows]
            # CPU seconds are the children's user+sys: the busy loop's, not the sleep's.
            self.assertGreaterEqual(busy_cpu, 1)
            self.assertGreaterEqual(busy_wall, busy_cpu)
            self.assertEqual(idle_cpu, 0)
            self.assertGreaterEqual(idle_wall, 1)

    def test_a_phase_beside_another_counts_only_its_own_work(self):
        # tools/test.sh runs a test phase in a background subshell beside a build: each shell
        # counts its own children, and the two never read each other's counters.
        with tempfile.TemporaryDirectory() as tmp:
            times = os.path.join(tmp, 'phases.tsv')
            script = f'''
                source {os.path.join(ROOT, 'tools', 'phase_times.sh')}
                phase_start
                ( phase_start; {sys.executable} -c "{BUSY_LOOP}"; phase_end "beside" ) &
                sleep 0.5
                phase_end "idle foreground"
                wait
                echo done
            '''
            run = subprocess.run(['bash', '-c', script], capture_output=True, text=True,
                                 env=dict(os.environ, ENGRAM_PHASE_TIMES=times))
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertEqual(run.stdout, 'done\n')
            with open(times) as f:
                rows = {r[0]: list(map(int, r[1:]))
                        for r in (line.rstrip('\n').split('\t') for line in f)}
            self.assertEqual(set(rows), {'beside', 'idle foreground'})
            self.assertGreaterEqual(rows['beside'][1], 1)
            self.assertEqual(rows['idle foreground'][1], 0)

    def test_without_the_variable_it_writes_nothing(self):
        script = f'source {os.path.join(ROOT, "tools", "phase_times.sh")}; phase_start; ' \
                 'phase_end x; echo ok'
        env = {k: v for k, v in os.environ.items() if k != 'ENGRAM_PHASE_TIMES'}
        run = subprocess.run(['bash', '-c', script], capture_output=True, text=True, env=env)
        self.assertEqual((run.returncode, run.stdout), (0, 'ok\n'), run.stderr)


if __name__ == '__main__':
    BUILD = os.path.abspath(sys.argv.pop(1))
    unittest.main()
