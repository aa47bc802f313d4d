package chdb

// The pool of engine connections: one per running statement, kept idle
// per set of connection-level settings (see DB).

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/dualflow/dualflow/internal/chsql"
)

type pooled struct {
	h   *uintptr
	key string
}

// acquire takes a slot and a connection configured for st's settings and
// database.
func (db *DB) acquire(ctx context.Context, st Statement) (pooled, error) {
	if err := ctx.Err(); err != nil {
		return pooled{}, err
	}
	select {
	case db.slots <- struct{}{}:
	case <-ctx.Done():
		return pooled{}, ctx.Err()
	}
	c, err := db.conn(st)
	if err != nil {
		<-db.slots
		return pooled{}, err
	}
	return c, nil
}

func (db *DB) conn(st Statement) (pooled, error) {
	key, err := db.settingsKey(st)
	if err != nil {
		return pooled{}, err
	}
	db.mu.Lock()
	if db.closed {
		db.mu.Unlock()
		return pooled{}, ErrClosed
	}
	if conns := db.idle[key]; len(conns) > 0 {
		h := conns[len(conns)-1]
		db.idle[key] = conns[:len(conns)-1]
		db.mu.Unlock()
		return pooled{h: h, key: key}, nil
	}
	db.mu.Unlock()

	args := []string{"--path=" + db.path}
	for _, name := range sortedKeys(st.Settings) {
		args = append(args, "--"+name+"="+st.Settings[name])
	}
	h := db.l.connectArgs(args)
	if h == nil {
		if len(st.Settings) > 0 {
			// The engine says why only on stderr; let it explain through a
			// statement that applies the same settings.
			if err := db.checkSettings(st.Settings); err != nil {
				return pooled{}, err
			}
		}
		return pooled{}, fmt.Errorf("chdb: connect failed (see stderr for the engine's message)")
	}
	if st.Database != "" && st.Database != "default" {
		if _, err := db.l.run(*h, Statement{Query: "USE " + chsql.Ident(st.Database), Format: "Null"}); err != nil {
			db.l.closeConn(h)
			return pooled{}, err
		}
	}
	return pooled{h: h, key: key}, nil
}

// release returns c to the pool, or closes it when the statement may have
// changed the connection's session state (USE, SET) or the pool is full.
func (db *DB) release(c pooled, query string, failed bool) {
	defer func() { <-db.slots }()
	// A statement that failed (for instance on max_result_rows while
	// writing its output) can leave its result behind on the connection,
	// where the next statement would read it: never pool such a connection.
	if failed || changesSession(query) {
		db.l.closeConn(c.h)
		return
	}
	db.mu.Lock()
	if db.closed || len(db.idle[c.key]) >= maxIdlePerKey {
		db.mu.Unlock()
		db.l.closeConn(c.h)
		return
	}
	db.idle[c.key] = append(db.idle[c.key], c.h)
	// Bound the number of distinct settings sets kept warm.
	if len(db.idle) > 4*cap(db.slots) {
		for k, conns := range db.idle {
			if k == c.key || k == "" {
				continue
			}
			for _, h := range conns {
				db.l.closeConn(h)
			}
			delete(db.idle, k)
			break
		}
	}
	db.mu.Unlock()
}

// changesSession reports whether a statement alters the connection's
// session (current database, settings), so its connection must not be
// reused for other statements.
func changesSession(query string) bool {
	lx := lexer{s: query}
	t := lx.next()
	return t.isWord("USE") || t.isWord("SET")
}

// settingsKey validates st's settings and database and returns the pool
// key of connections configured for them.
func (db *DB) settingsKey(st Statement) (string, error) {
	if len(st.Settings) == 0 && (st.Database == "" || st.Database == "default") {
		return "", nil
	}
	var b strings.Builder
	b.WriteString(st.Database)
	for _, name := range sortedKeys(st.Settings) {
		// Only a name of system.settings reaches the engine's connect
		// arguments (--name=value).
		known, err := db.knownSetting(name)
		if err != nil {
			return "", err
		}
		if !known {
			return "", unknownSetting(name)
		}
		b.WriteString("\x00" + name + "=" + st.Settings[name])
	}
	return b.String(), nil
}

func unknownSetting(name string) error {
	return &Error{Code: CodeUnknownSetting, Name: "UNKNOWN_SETTING",
		Message: fmt.Sprintf("Unknown setting '%s'. (UNKNOWN_SETTING)", name)}
}

// knownSetting reports whether the engine has a setting called name
// (system.settings, loaded once).
func (db *DB) knownSetting(name string) (bool, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.known == nil && db.knownErr == nil {
		res, err := db.l.run(*db.anchor, Statement{Query: "SELECT name FROM system.settings", Format: "TabSeparated"})
		if err != nil {
			db.knownErr = err
		} else {
			db.known = make(map[string]bool)
			for _, n := range strings.Split(string(res.Data), "\n") {
				if n != "" {
					db.known[n] = true
				}
			}
		}
	}
	if db.knownErr != nil {
		return false, db.knownErr
	}
	return db.known[name], nil
}

// checkSettings runs a no-op statement with settings applied through a
// SETTINGS clause, to get the engine's own error for a bad value.
func (db *DB) checkSettings(settings map[string]string) error {
	var set []string
	for _, name := range sortedKeys(settings) {
		set = append(set, name+" = "+chsql.String(settings[name]))
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	_, err := db.l.run(*db.anchor, Statement{Query: "SELECT 1 FORMAT Null SETTINGS " + strings.Join(set, ", "), Format: "Null"})
	return err
}

func sortedKeys(m map[string]string) []string {
	keys := slices.Sorted(maps.Keys(m))
	// readonly last: applied first, it would forbid the settings after it.
	if i := slices.Index(keys, "readonly"); i >= 0 {
		keys = append(slices.Delete(keys, i, i+1), "readonly")
	}
	return keys
}
