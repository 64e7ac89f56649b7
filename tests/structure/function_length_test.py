#!/usr/bin/env python3
"""Known cases for tools/check_function_length.py: what it counts as a function, how long."""

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'tools')
sys.path.insert(0, TOOLS)
import check_function_length as checker  # noqa: E402


def functions(src):
    """{name: lines} of the functions the checker finds in src."""
    found = checker.scan('t.cc', textwrap.dedent(src))
    return {fn.name: fn.lines for fn in found}


def body(lines):
    return '\n'.join(f'  x += {k};' for k in range(lines))


class ScanTest(unittest.TestCase):
    def test_length_counts_brace_line_to_closing_brace(self):
        self.assertEqual(functions('int F(int x)\n{\n  return x;\n}\n'), {'F': 3})
        self.assertEqual(functions('int F(int x) {\n' + body(5) + '\n}\n'), {'F': 7})

    def test_braces_in_comments_and_literals_are_ignored(self):
        src = '''
        // a brace in a comment {
        /* and { in a block comment */
        const char* kOpen = "{ \\" {";
        char kBrace = '{';
        const char* kRaw = R"json({"a": {)json";
        int F() {
          auto s = R"(})";  // }
          return '}' + 1'000'000;
        }
        '''
        self.assertEqual(functions(src), {'F': 4})

    def test_preprocessor_lines_are_ignored(self):
        src = '#define OPEN {\n#define M(x) \\\n  { x }\nint F() {\n  return 1;\n}\n'
        self.assertEqual(functions(src), {'F': 3})

    def test_qualifiers_trailing_return_and_initialiser_lists(self):
        src = '''
        namespace engram {
        extern "C" {
        int Plain(int a) { return a; }
        }
        class Foo : public Bar {
         public:
          Foo(int a, int b) noexcept : a_{a}, b_(b), c_{} {
            Go();
          }
          ~Foo() override { Stop(); }
          int Get() const& noexcept { return a_; }
          auto Sum() const -> std::pair<int, int> {
            return {a_, b_};
          }
          bool operator==(const Foo& o) const = default;
          int operator()(int x) const { return x; }
          void Set(Opts o = {}) { o_ = o; }
         private:
          int a_{0};
          int b_ = {1};
          struct Inner { int Twice() { return 2; } };
        };
        int Foo::Out() const
        {
          return 3;
        }
        }  // namespace engram
        '''
        self.assertEqual(functions(src), {
            'Plain': 1, 'Foo::Foo': 3, 'Foo::~Foo': 1, 'Foo::Get': 1, 'Foo::Sum': 3,
            'Foo::operator()': 1, 'Foo::Set': 1, 'Foo::Inner::Twice': 1, 'Foo::Out': 3})

    def test_lambdas_count_toward_their_function(self):
        src = '''
        void Run() {
          auto f = [&](int x) {
            return x;
          };
          std::sort(v.begin(), v.end(), [](int a, int b) { return a < b; });
        }
        '''
        self.assertEqual(functions(src), {'Run': 6})

    def test_lambdas_at_namespace_scope_are_functions(self):
        src = '''
        const auto kTwice = [](int x) {
          return 2 * x;
        };
        const Command kCommands[] = {
          {"a", [](const Args& a) -> int {
             return a.n;
           }},
          {"b", &RunB},
        };
        int Table[] = {1, 2, 3};
        '''
        self.assertEqual(functions(src), {'kTwice[lambda]': 3, '[lambda]': 3})

    def test_templates_and_device_code(self):
        src = '''
        template <typename T, int (*F)(int)>
        T Apply(T x) {
          return F(x);
        }
        template <class T> struct Box { T Get() { return t; } T t; };
        __global__ void Kernel(int* p) {
          p[0] = 1;
        }
        __host__ __device__ inline int Both(int x) { return x; }
        '''
        self.assertEqual(functions(src), {'Apply': 3, 'Box::Get': 1})

    def test_unbalanced_braces_are_an_error(self):
        with self.assertRaises(checker.ScanError):
            checker.scan('t.cc', 'int F() {\n')
        with self.assertRaises(checker.ScanError):
            checker.scan('t.cc', 'int F() { }\n}\n')


class AllowListTest(unittest.TestCase):
    def run_checker(self, files, allow):
        with tempfile.TemporaryDirectory() as root:
            for name, text in files.items():
                with open(os.path.join(root, name), 'w') as f:
                    f.write(text)
            with open(os.path.join(root, 'allow.txt'), 'w') as f:
                f.write(allow)
            result = subprocess.run(
                [sys.executable, os.path.join(TOOLS, 'check_function_length.py'), '--limit', '5',
                 '--root', root, '--allow', os.path.join(root, 'allow.txt'), '.'],
                capture_output=True, text=True)
            return result.returncode, result.stderr

    LONG = 'int Long() {\n' + body(6) + '\n}\nint Short() { return 1; }\n'

    def test_function_over_the_limit_fails(self):
        rc, err = self.run_checker({'a.cc': self.LONG}, '')
        self.assertEqual(rc, 1)
        self.assertIn('a.cc:1: Long has 8 lines, over the limit of 5', err)

    def test_allow_listed_function_passes(self):
        rc, err = self.run_checker({'a.cc': self.LONG}, '# comment\na.cc  Long  to split\n')
        self.assertEqual((rc, err), (0, ''))

    def test_allow_listed_function_under_the_limit_fails(self):
        rc, err = self.run_checker({'a.cc': self.LONG},
                                   'a.cc  Long  to split\na.cc  Short  to split\n')
        self.assertEqual(rc, 1)
        self.assertIn('a.cc Short is no longer over the limit', err)

    def test_allow_list_line_without_reason_fails(self):
        rc, err = self.run_checker({'a.cc': self.LONG}, 'a.cc  Long\n')
        self.assertNotEqual(rc, 0)
        self.assertIn('expected "path  name  reason"', err)


if __name__ == '__main__':
    unittest.main()
