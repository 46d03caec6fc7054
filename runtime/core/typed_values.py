"""The typed values a generation can be constrained to (``gen(dtype=int)``, ``value_type``):
SGLang's frontend regexes (``sglang/lang/ir.py``), one definition shared by the frontend (which
sends them as ``regex`` to servers that only know regexes) and the runtime (which compiles
``value_type`` constraints from them). No imports: the frontend loads it without the engine.
"""

REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""

VALUE_TYPE_REGEX = {"int": REGEX_INT, "float": REGEX_FLOAT, "bool": REGEX_BOOL, "str": REGEX_STR}

# SGLang's frontend ends a number at its first space or newline (its ``RuntimeEndpoint`` adds
# these stop strings to int / float gens): the regexes allow trailing whitespace, and without
# the stops a sampled number runs on in blank lines to ``max_tokens``.
VALUE_TYPE_STOP = {"int": (" ", "\n"), "float": (" ", "\n"), "bool": (), "str": (),
                   None: ()}                                  # None: an untyped gen
