"""Reading the command line of a `sh -c` container the way the shell would split it.

Real Dynamo manifests often start the engine from one shell string, with quotes, continuations
and `&&` chains; discovery needs the words of each simple command in it.
"""

from __future__ import annotations

import re
from typing import Final

DIGITS: Final = re.compile(r"\d+")
_WHITESPACE: Final = " \t\r"
_OPERATORS: Final = frozenset(";&|()<>\n")  # each ends the simple command it follows
_DOUBLE_QUOTE_ESCAPES: Final = frozenset('$`"\\\n')


def shell_commands(script: str) -> list[list[str]]:
    """Split a POSIX `sh -c` script into simple commands, each a list of words.

    Quotes are removed and backslash-newline continuations joined, as the shell does; `$VAR`,
    `${VAR}`, `$(...)` and backticks stay literal, since their values are not in the manifest.
    Operators (`&&`, `||`, `;`, `|`, `&`, redirections, newlines) end a command. `shlex` is not
    used because it cannot tell a quoted `'&&'` from an operator, nor a newline from a space.
    Raises ValueError for an unterminated quote or substitution.
    """
    return _ShellLexer(script).run()


class _ShellLexer:
    def __init__(self, script: str) -> None:
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
            else:
                parts.append(self.text[i])
                i += 1
        if i >= len(self.text):
            raise ValueError("unterminated double quote in shell script")
        self._append("".join(parts), i + 1)

    def _substitution(self, char: str) -> None:
        """Keep `$(...)`, `${...}` and backticks as written, nested brackets included."""
        if char == "`":
            end = self.text.find("`", self.pos + 1)
        else:
            end = _closing_bracket(self.text, self.pos + 1)
        if end < 0:
            raise ValueError("unterminated substitution in shell script")
        self._append(self.text[self.pos : end + 1], end + 1)


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
