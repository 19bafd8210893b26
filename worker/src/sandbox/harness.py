# Belay sandbox harness for `runtime: python` (run with `python3 -I -S -B -c`).
# Reads {"code", "params", "args"} as JSON from stdin, runs the code as the
# body of a function whose parameters are `params` (each bound to the
# argument of that name, None when absent), and writes exactly one JSON line
# to stdout: {"ok": <result>} or {"error": {"kind", "name", "message",
# "trace"}}. What the code prints goes to stderr, so stdout carries the
# result only.
import ast, json, sys, traceback

_MAX_TRACE = 4000
_out = sys.stdout


def _emit(text):
    _out.write(text + "\n")
    _out.flush()


def _fail(kind, e, trace=""):
    _emit(json.dumps({"error": {"kind": kind, "name": type(e).__name__,
                                "message": str(e), "trace": trace[-_MAX_TRACE:]}}))


def _main():
    try:
        data = json.loads(sys.stdin.read())
        code, params, args = data["code"], data["params"], data["args"]
    except Exception as e:
        _fail("harness", e)
        return
    sys.stdout = sys.stderr
    try:
        body = ast.parse(code, filename="tool.py").body or [ast.Pass()]
        fields = dict(
            name="tool",
            args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=p) for p in params],
                               vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None,
                               defaults=[]),
            body=body, decorator_list=[], returns=None, type_comment=None)
        if "type_params" in ast.FunctionDef._fields:
            fields["type_params"] = []
        module = ast.fix_missing_locations(ast.Module(body=[ast.FunctionDef(**fields)],
                                                      type_ignores=[]))
        namespace = {"__name__": "tool"}
        exec(compile(module, "tool.py", "exec"), namespace)
    except SyntaxError as e:
        _fail("syntax", e, "".join(traceback.format_exception_only(type(e), e)))
        return
    try:
        result = namespace["tool"](*[args.get(p) for p in params])
    except BaseException as e:
        # The code's frames only, not the harness's.
        tb = e.__traceback__.tb_next if e.__traceback__ else None
        _fail("exception", e, "".join(traceback.format_exception(type(e), e, tb)))
        return
    if result is None:
        _emit(json.dumps({"error": {"kind": "result", "name": "None",
                                    "message": "the code returned nothing (None): `return` the result",
                                    "trace": ""}}))
        return
    try:
        text = json.dumps({"ok": result}, allow_nan=False)
    except (TypeError, ValueError) as e:
        _fail("result", e)
        return
    _emit(text)


_main()
