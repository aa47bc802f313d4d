package chhttp

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"slices"
	"strings"

	"github.com/dualflow/dualflow/internal/atomicfile"
	"github.com/dualflow/dualflow/internal/secretfile"
)

// Access is what a request may do.
type Access int

const (
	// AccessNone refuses the request (401).
	AccessNone Access = iota
	// AccessReadOnly runs reads only: readonly=1 under the server's
	// ReaderLimits (URL settings may only lower them, and format the
	// answer) and the sqlguard check.
	AccessReadOnly
	// AccessInsert runs INSERTs into tables (not into table functions)
	// and, otherwise, reads as AccessReadOnly does: the collectors' user
	// of `dualflow store`. Its INSERTs have an engine slot no other user
	// may take.
	AccessInsert
	// AccessFull runs any one statement but INTO OUTFILE (as a ClickHouse
	// server's HTTP interface), writes and DDL included.
	AccessFull
)

// ParseAccess reads "none", "readonly" or "full".
func ParseAccess(s string) (Access, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "none", "":
		return AccessNone, nil
	case "readonly", "read-only":
		return AccessReadOnly, nil
	case "insert":
		return AccessInsert, nil
	case "full":
		return AccessFull, nil
	}
	return AccessNone, fmt.Errorf("access %q: want none, readonly, insert or full", s)
}

func (a Access) String() string {
	switch a {
	case AccessReadOnly:
		return "readonly"
	case AccessInsert:
		return "insert"
	case AccessFull:
		return "full"
	}
	return "none"
}

// User is one account of the HTTP interface, as in ClickHouse's users.xml:
// a name, a password (plain or its SHA-256), and whether it may write.
type User struct {
	Name string `json:"name"`
	// Password in clear; dualflow writes the generated file this way so
	// that `dualflow sql` can read it (the file is 0600).
	Password string `json:"password,omitempty"`
	// PasswordSHA256Hex is the hex SHA-256 of the password, as ClickHouse's
	// password_sha256_hex; for files written by an operator.
	PasswordSHA256Hex string `json:"password_sha256_hex,omitempty"`
	// ReadOnly users run reads only (see AccessReadOnly).
	ReadOnly bool `json:"readonly,omitempty"`
	// InsertOnly users insert into tables and read (see AccessInsert).
	InsertOnly bool `json:"insert_only,omitempty"`
}

// access is what u may do.
func (u User) access() Access {
	switch {
	case u.ReadOnly:
		return AccessReadOnly
	case u.InsertOnly:
		return AccessInsert
	}
	return AccessFull
}

// UsersFile is the JSON document of a users file.
type UsersFile struct {
	Users []User `json:"users"`
}

// Generated users of a new users file.
const (
	AdminUser    = "admin"    // full access: INSERT, DDL, migrations, dualflow sql --write
	ReaderUser   = "reader"   // reads only
	InserterUser = "inserter" // inserts into tables and reads: collectors of dualflow store
)

// LoadOrCreateUsers reads the users file at path, or creates it with an
// admin, a reader and an inserter user with random passwords (0600, in a
// 0700 directory) when it does not exist. A file without the inserter
// (written before it existed) gets it added. It refuses a file others may
// access, as LoadUsers does. created reports a new file, or a user added.
func LoadOrCreateUsers(path string) (users []User, created bool, err error) {
	users, err = LoadUsers(path)
	if err == nil {
		if _, ok := Find(users, InserterUser); ok {
			return users, false, nil
		}
		users = append(users, User{Name: InserterUser, Password: randomPassword(), InsertOnly: true})
		b, err := json.MarshalIndent(UsersFile{Users: users}, "", "  ")
		if err != nil {
			return nil, false, err
		}
		if err := atomicfile.Write(path, 0o600, func(w io.Writer) error { _, err := w.Write(append(b, '\n')); return err }); err != nil {
			return nil, false, fmt.Errorf("users file: %w", err)
		}
		return users, true, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return users, false, err
	}
	users = []User{{Name: AdminUser, Password: randomPassword()}, {Name: ReaderUser, Password: randomPassword(), ReadOnly: true},
		{Name: InserterUser, Password: randomPassword(), InsertOnly: true}}
	b, err := json.MarshalIndent(UsersFile{Users: users}, "", "  ")
	if err != nil {
		return nil, false, err
	}
	err = secretfile.Create("users file", path, append(b, '\n'))
	if errors.Is(err, fs.ErrExist) { // another process won the race
		users, err = LoadUsers(path)
		return users, false, err
	}
	if err != nil {
		return nil, false, err
	}
	return users, true, nil
}

// LoadUsers reads and checks a users file, a secret file (secretfile.Read:
// mode 0600, or 0640 for the process's own group).
func LoadUsers(path string) ([]User, error) {
	b, err := secretfile.Read("users file", path)
	if err != nil {
		return nil, err
	}
	var uf UsersFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&uf); err != nil {
		return nil, fmt.Errorf("users file %s: %w", path, err)
	}
	if err := validateUsers(uf.Users); err != nil {
		return nil, fmt.Errorf("users file %s: %w", path, err)
	}
	return uf.Users, nil
}

func validateUsers(users []User) error {
	seen := map[string]bool{}
	for i, u := range users {
		switch {
		case u.Name == "":
			return fmt.Errorf("user %d has no name", i)
		case seen[u.Name]:
			return fmt.Errorf("user %q appears twice", u.Name)
		case (u.Password == "") == (u.PasswordSHA256Hex == ""):
			return fmt.Errorf("user %q needs exactly one of password and password_sha256_hex", u.Name)
		case u.ReadOnly && u.InsertOnly:
			return fmt.Errorf("user %q is both readonly and insert_only", u.Name)
		case u.PasswordSHA256Hex != "":
			if b, err := hex.DecodeString(u.PasswordSHA256Hex); err != nil || len(b) != sha256.Size {
				return fmt.Errorf("user %q: password_sha256_hex is not 64 hex digits", u.Name)
			}
		}
		seen[u.Name] = true
	}
	return nil
}

// Find returns the named user of a users file, for clients of the
// interface such as `dualflow sql`.
func Find(users []User, name string) (User, bool) {
	if i := slices.IndexFunc(users, func(u User) bool { return u.Name == name }); i >= 0 {
		return users[i], true
	}
	return User{}, false
}

func randomPassword() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// authenticator checks the credentials of a request.
type authenticator struct {
	users     map[string][sha256.Size]byte // name → SHA-256 of the password
	access    map[string]Access
	anonymous Access
}

func newAuthenticator(users []User, anonymous Access) (*authenticator, error) {
	if err := validateUsers(users); err != nil {
		return nil, fmt.Errorf("chhttp: %w", err)
	}
	a := &authenticator{users: map[string][sha256.Size]byte{}, access: map[string]Access{}, anonymous: anonymous}
	for _, u := range users {
		var sum [sha256.Size]byte
		if u.PasswordSHA256Hex != "" {
			b, _ := hex.DecodeString(u.PasswordSHA256Hex)
			copy(sum[:], b)
		} else {
			sum = sha256.Sum256([]byte(u.Password))
		}
		a.users[u.Name] = sum
		a.access[u.Name] = u.access()
	}
	return a, nil
}

// credentials reads a request's user and password the ways ClickHouse
// clients send them: HTTP Basic (curl -u, clickhouse-go),
// X-ClickHouse-User/X-ClickHouse-Key headers, or user/password URL
// parameters. A password without a user is the "default" user's, as in
// ClickHouse. ok is false when the request carries none.
func credentials(r *http.Request) (user, password string, ok bool) {
	if u, p, found := r.BasicAuth(); found {
		return u, p, true
	}
	h := r.Header
	if u, p := h.Get("X-ClickHouse-User"), h.Get("X-ClickHouse-Key"); u != "" || p != "" {
		return cmp.Or(u, "default"), p, true
	}
	q := r.URL.Query()
	if u, p := q.Get("user"), q.Get("password"); u != "" || p != "" {
		return cmp.Or(u, "default"), p, true
	}
	return "", "", false
}

// authenticate returns what the request may do and, when it may do
// nothing, why.
func (a *authenticator) authenticate(r *http.Request) (user string, access Access, err error) {
	user, password, ok := credentials(r)
	if !ok {
		if a.anonymous == AccessNone {
			return "", AccessNone, errors.New("authentication required: send a user and password (curl -u user:password, HTTP Basic, X-ClickHouse-User/X-ClickHouse-Key, or ?user=&password=); the collector wrote them to its users file at first start")
		}
		return "", a.anonymous, nil
	}
	want, known := a.users[user]
	got := sha256.Sum256([]byte(password))
	// Compare even for an unknown user, so that timing does not tell which
	// names exist.
	match := subtle.ConstantTimeCompare(got[:], want[:]) == 1
	if !known || !match {
		return user, AccessNone, fmt.Errorf("%s: Authentication failed: password is incorrect, or there is no user with such name", user)
	}
	return user, a.access[user], nil
}
