"""Reading the command line of a `sh -c` container the way the shell would split it.

Real Dynamo manifests often start the engine from one shell string, with quotes, continuations,
`&&` chains and `${VAR:-default}` references to the container's env; discovery needs the words
of each simple command in it, as the engine receives them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

DIGITS: Final = re.compile(r"\d+")
NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# `${NAME}`, `${NAME:-word}` and the other operators whose outcome depends only on the value.
_BRACED: Final = re.compile(
    r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-=+])(?P<word>.*))?\}", re.S
)
_IFS: Final = re.compile(r"[ \t\n]+")
_WHITESPACE: Final = " \t\r"
_OPERATORS: Final = frozenset(";&|()<>\n")  # each ends the simple command it follows
_DOUBLE_QUOTE_ESCAPES: Final = frozenset('$`"\\\n')


def shell_commands(script: str, env: Mapping[str, str | None] | None = None) -> list[list[str]]:
    """Split a POSIX `sh -c` script into simple commands, each a list of words.

    Quotes are removed and backslash-newline continuations joined, as the shell does. Operators
    (`&&`, `||`, `;`, `|`, `&`, redirections, newlines) end a command. `shlex` is not used
    because it cannot tell a quoted `'&&'` from an operator, nor a newline from a space.

    `$VAR`, `${VAR}` and `${VAR:-default}` (and `-`, `+`, `=` with or without `:`) outside
    single quotes take their value from `env`, unquoted ones split into words as the shell
    splits them. A name `env` maps to None (its value is only known in the pod) stays as
    written, and so does one `env` lacks, unless a default decides: the image or an `envFrom`
    may set it. `$(...)` and backticks always stay as written. Without `env` nothing is expanded.
    Raises ValueError for an unterminated quote or substitution.
    """
    return _ShellLexer(script, env).run()


def expand_parameter(reference: str, env: Mapping[str, str | None]) -> str | None:
    """The value of `$NAME` or `${NAME...}`, or None when the manifest does not decide it."""
    if reference[1:2] != "{":
        value = env.get(reference[1:])
        return value if isinstance(value, str) else None
    match = _BRACED.fullmatch(reference)
    if match is None:
        return None  # `${#X}`, `${X%y}`, `${1}`: not worth guessing
    name, op, word = match["name"], match["op"], match["word"]
    if name in env and env[name] is None:
        return None
    value = env.get(name)
    if op is None:
        return value
    is_set = value is not None and (value != "" or not op.startswith(":"))
    if op[-1] == "+":
        return _expand_word(word, env) if is_set else ""
    if is_set:
        return value
    return _expand_word(word, env) if name not in env or op.startswith(":") else value


def _expand_word(word: str, env: Mapping[str, str | None]) -> str | None:
    """A default's own references expanded; None when one of them cannot be."""
    lexer = _ShellLexer(word, env, split=False)
    try:
        words = lexer.run()
    except ValueError:
        return None
    return " ".join(" ".join(c) for c in words) if not lexer.kept else None


class _ShellLexer:
    def __init__(
        self, script: str, env: Mapping[str, str | None] | None = None, *, split: bool = True
    ) -> None:
        self.env = env
        self.split = split
        self.kept = False  # a reference was left as written
        self.text = script
        self.pos = 0
        self.word: list[str] | None = None  # None: between words
        self.word_start = 0
        self.command: list[str] = []
        self.commands: list[list[str]] = []

    def run(self) -> list[list[str]]:
        while self.pos < len(self.text):
            self._step(self.text[self.pos])
        self._end_command()
        return self.commands

    def _step(self, char: str) -> None:
        if char in _WHITESPACE:
            self._end_word()
            self.pos += 1
        elif char == "#" and self.word is None:
            self._skip_comment()
        elif char in _OPERATORS:
            self._operator(char)
        elif char == "\\":
            self._escape()
        elif char == "'":
            self._single_quoted()
        elif char == '"':
            self._double_quoted()
        elif char == "`" or (char == "$" and self.text[self.pos + 1 : self.pos + 2] in ("(", "{")):
            self._substitution(char)
        elif char == "$" and self.env is not None and NAME.match(self.text, self.pos + 1):
            self._bare_reference()
        else:
            self._append(char, self.pos + 1)

    def _append(self, text: str, next_pos: int) -> None:
        if self.word is None:
            self.word, self.word_start = [], self.pos
        self.word.append(text)
        self.pos = next_pos

    def _end_word(self) -> None:
        if self.word is not None:
            self.command.append("".join(self.word))
            self.word = None

    def _end_command(self) -> None:
        self._end_word()
        if self.command:
            self.commands.append(self.command)
        self.command = []

    def _skip_comment(self) -> None:
        end = self.text.find("\n", self.pos)
        self.pos = len(self.text) if end < 0 else end

    def _operator(self, char: str) -> None:
        if (
            char in "<>"
            and self.word is not None
            and DIGITS.fullmatch(self.text[self.word_start : self.pos])
        ):
            self.word = None  # `2>&1`: the digits name a file descriptor, not an argument
        self._end_command()
        self.pos += 1

    def _escape(self) -> None:
        following = self.text[self.pos + 1 : self.pos + 2]
        if following == "\n":
            self.pos += 2  # a continuation joins the lines
        elif following:
            self._append(following, self.pos + 2)
        else:
            self._append("\\", self.pos + 1)

    def _single_quoted(self) -> None:
        end = self.text.find("'", self.pos + 1)
        if end < 0:
            raise ValueError("unterminated single quote in shell script")
        self._append(self.text[self.pos + 1 : end], end + 1)

    def _double_quoted(self) -> None:
        parts, i = [], self.pos + 1
        while i < len(self.text) and self.text[i] != '"':
            following = self.text[i + 1 : i + 2]
            if self.text[i] == "\\" and following and following in _DOUBLE_QUOTE_ESCAPES:
                parts.append("" if following == "\n" else following)
                i += 2
            elif self.text[i] == "$" and self.env is not None and (end := self._reference_end(i)):
                parts.append(self._value(self.text[i:end]))
                i = end
            else:
                parts.append(self.text[i])
                i += 1
        if i >= len(self.text):
            raise ValueError("unterminated double quote in shell script")
        self._append("".join(parts), i + 1)

    def _substitution(self, char: str) -> None:
        """Keep `$(...)` and backticks as written, nested brackets included; expand `${...}`."""
        if char == "`":
            end = self.text.find("`", self.pos + 1)
        else:
            end = _closing_bracket(self.text, self.pos + 1)
        if end < 0:
            raise ValueError("unterminated substitution in shell script")
        if self.env is not None and self.text[self.pos + 1] == "{":
            self._expanded(self.text[self.pos : end + 1], end + 1)
        else:
            self._append(self.text[self.pos : end + 1], end + 1)

    def _bare_reference(self) -> None:
        match = NAME.match(self.text, self.pos + 1)
        assert match is not None  # checked by the caller
        self._expanded(self.text[self.pos : match.end()], match.end())

    def _reference_end(self, i: int) -> int:
        """Where `$NAME` or `${...}` starting at i ends; 0 when none starts there."""
        if self.text[i + 1 : i + 2] == "{":
            end = _closing_bracket(self.text, i + 1)
            return end + 1 if end > 0 else 0
        match = NAME.match(self.text, i + 1)
        return match.end() if match else 0

    def _value(self, reference: str) -> str:
        value = expand_parameter(reference, self.env or {})
        if value is None:
            self.kept = True
            return reference
        return value

    def _expanded(self, reference: str, next_pos: int) -> None:
        """An unquoted expansion: its value split into words at blanks, as the shell does."""
        value = self._value(reference)
        if value == reference or not self.split:
            self._append(value, next_pos)
            return
        for i, piece in enumerate(_IFS.split(value)):
            if i:
                self._end_word()
            if piece:
                self._append(piece, next_pos)
        self.pos = next_pos


def _closing_bracket(text: str, opening: int) -> int:
    pairs = {"(": ")", "{": "}"}
    close, depth = pairs[text[opening]], 0
    for i in range(opening, len(text)):
        if text[i] == text[opening]:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i
    return -1
