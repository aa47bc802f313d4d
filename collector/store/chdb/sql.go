package chdb

import "strings"

// InsertStatement is an INSERT whose data follows the statement text: the
// statement split at its FORMAT (or VALUES) clause, as ClickHouse's parser
// splits it before streaming the data to the input format.
type InsertStatement struct {
	// Query is the statement without the FORMAT clause, e.g.
	// "INSERT INTO db.t (a, b) SETTINGS insert_deduplication_token='x'".
	Query string
	// Format is the input format of the data: the FORMAT clause's name, or
	// "Values" for INSERT ... VALUES and for an INSERT with neither clause.
	Format string
	// DataOffset is the offset in the parsed text where inline data starts
	// (len(text) when there is none). Like ClickHouse, the data of a FORMAT
	// clause starts after the spaces and the first newline that follow the
	// format name.
	DataOffset int
	// Function reports INSERT INTO [TABLE] FUNCTION: the rows go to a
	// table function (a file, a URL, another server), not to a table.
	Function bool
}

// SplitInsert parses text as an INSERT that takes data (FORMAT x or VALUES)
// and reports false for anything else, including INSERT ... SELECT. It only
// tokenizes (quotes, comments, parentheses); the engine validates the rest.
func SplitInsert(text string) (InsertStatement, bool) {
	lx := lexer{s: text}
	tok := lx.next()
	if !tok.isWord("INSERT") {
		return InsertStatement{}, false
	}
	function := false
	{
		probe := lx
		t := probe.next()
		if t.isWord("INTO") {
			t = probe.next()
		}
		if t.isWord("TABLE") {
			t = probe.next()
		}
		function = t.isWord("FUNCTION")
	}
	ins, ok := splitInsert(text, &lx, tok)
	ins.Function = function
	return ins, ok
}

// SplitStatements splits SQL text into its statements: on ';' outside
// quotes and comments, each from its first token (comments before it are
// dropped) to its last, the empty ones omitted.
func SplitStatements(text string) []string {
	var out []string
	lx := lexer{s: text}
	start, end := -1, 0
	for {
		tok := lx.next()
		if tok.kind == tokEOF || tok.isPunct(";") {
			if start >= 0 {
				out = append(out, text[start:end])
			}
			if tok.kind == tokEOF {
				return out
			}
			start = -1
			continue
		}
		if start < 0 {
			start = tok.start
		}
		end = tok.end
	}
}

func splitInsert(text string, lx *lexer, tok token) (InsertStatement, bool) {
	depth := 0
	prev := tok
	for {
		tok = lx.next()
		switch {
		case tok.kind == tokEOF:
			return InsertStatement{Query: strings.TrimSpace(text), Format: "Values", DataOffset: len(text)}, true
		case tok.kind == tokPunct && tok.text == "(":
			depth++
		case tok.kind == tokPunct && tok.text == ")":
			if depth > 0 {
				depth--
			}
		case depth > 0:
		case tok.kind == tokPunct && tok.text == ";":
			return InsertStatement{Query: strings.TrimSpace(text[:tok.start]), Format: "Values", DataOffset: len(text)}, true
		case tok.isWord("SELECT") || tok.isWord("WITH") || tok.isWord("INFILE"):
			return InsertStatement{}, false
		case tok.isWord("VALUES") && !prev.isPunct("."):
			return InsertStatement{Query: strings.TrimSpace(text[:tok.start]), Format: "Values", DataOffset: tok.end}, true
		case tok.isWord("FORMAT") && !prev.isWord("INTO") && !prev.isWord("TABLE") && !prev.isWord("FUNCTION") && !prev.isPunct("."):
			name := lx.next()
			if name.kind != tokWord {
				return InsertStatement{}, false
			}
			return InsertStatement{
				Query:      strings.TrimSpace(text[:tok.start]),
				Format:     name.text,
				DataOffset: dataStart(text, name.end),
			}, true
		}
		prev = tok
	}
}

// dataStart mirrors ClickHouse's ParserInsertQuery: data begins after the
// blanks that follow the format name and at most one line break.
func dataStart(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\f') {
		i++
	}
	if i < len(s) && s[i] == '\r' {
		i++
	}
	if i < len(s) && s[i] == '\n' {
		i++
	}
	return i
}

type tokKind uint8

const (
	tokEOF tokKind = iota
	tokWord
	tokQuoted // '...', "...", `...`
	tokNumber
	tokPunct
)

type token struct {
	kind       tokKind
	text       string
	start, end int
}

func (t token) isWord(w string) bool  { return t.kind == tokWord && strings.EqualFold(t.text, w) }
func (t token) isPunct(p string) bool { return t.kind == tokPunct && t.text == p }

// lexer splits ClickHouse SQL into the few token classes SplitInsert needs,
// skipping whitespace and comments (--, #␠, #!, nested /* */). An unterminated
// quote or comment runs to the end of the text.
type lexer struct {
	s   string
	pos int
}

func (lx *lexer) next() token {
	lx.skipSpace()
	s, i := lx.s, lx.pos
	if i >= len(s) {
		return token{kind: tokEOF, start: i, end: i}
	}
	c := s[i]
	var kind tokKind
	j := i + 1
	switch {
	case c == '\'' || c == '"' || c == '`':
		kind = tokQuoted
		j = closeQuote(s, i)
	case isIdentStart(c):
		kind = tokWord
		for j < len(s) && isIdentPart(s[j]) {
			j++
		}
	case c >= '0' && c <= '9':
		kind = tokNumber
		for j < len(s) && (isIdentPart(s[j]) || s[j] == '.') {
			j++
		}
	default:
		kind = tokPunct
	}
	lx.pos = j
	return token{kind: kind, text: s[i:j], start: i, end: j}
}

func (lx *lexer) skipSpace() {
	s := lx.s
	for lx.pos < len(s) {
		i := lx.pos
		switch c := s[i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			lx.pos++
		case c == '-' && i+1 < len(s) && s[i+1] == '-',
			c == '#' && i+1 < len(s) && (s[i+1] == ' ' || s[i+1] == '!'):
			if nl := strings.IndexByte(s[i:], '\n'); nl >= 0 {
				lx.pos = i + nl + 1
			} else {
				lx.pos = len(s)
			}
		case c == '/' && i+1 < len(s) && s[i+1] == '*':
			lx.pos = closeBlockComment(s, i)
		default:
			return
		}
	}
}

// closeQuote returns the offset after the quote that closes the one at i.
// Backslash escapes and doubled quotes are both accepted, as in ClickHouse.
func closeQuote(s string, i int) int {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case q:
			if j+1 < len(s) && s[j+1] == q {
				j++
				continue
			}
			return j + 1
		}
	}
	return len(s)
}

// closeBlockComment returns the offset after the comment opened at i;
// ClickHouse allows nesting.
func closeBlockComment(s string, i int) int {
	depth := 0
	for j := i; j+1 < len(s); j++ {
		switch {
		case s[j] == '/' && s[j+1] == '*':
			depth++
			j++
		case s[j] == '*' && s[j+1] == '/':
			depth--
			j++
			if depth == 0 {
				return j + 1
			}
		}
	}
	return len(s)
}

func isIdentStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80
}

func isIdentPart(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') }

// OutputFormat returns the name in a statement's top-level FORMAT clause
// ("SELECT 1 FORMAT JSON" → "JSON"), or "" when it has none. INSERT
// statements have an input format, not an output one: they return "".
func OutputFormat(text string) string {
	lx := lexer{s: text}
	depth := 0
	format := ""
	first := true
	for {
		tok := lx.next()
		switch {
		case tok.kind == tokEOF:
			return format
		case first && tok.isWord("INSERT"):
			return ""
		case tok.isPunct("("):
			depth++
		case tok.isPunct(")"):
			if depth > 0 {
				depth--
			}
		case depth == 0 && tok.isWord("FORMAT"):
			if name := lx.next(); name.kind == tokWord {
				format = name.text
			}
		}
		first = false
	}
}

// IntoOutfile reports whether text holds the words INTO OUTFILE as
// tokens, at any depth, outside quotes and comments: a statement that
// would write a file (the engine writes it itself, checking no grant).
func IntoOutfile(text string) bool {
	lx := lexer{s: text}
	prev := token{}
	for {
		tok := lx.next()
		if tok.kind == tokEOF {
			return false
		}
		if tok.isWord("OUTFILE") && prev.isWord("INTO") {
			return true
		}
		prev = tok
	}
}
