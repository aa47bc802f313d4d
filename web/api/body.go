package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"
)

// maxBodyBytes bounds a JSON request body other than POST /sql's (which
// has its own, sized for the query): a request is a few hundred bytes.
const maxBodyBytes = 1 << 20

// bindJSON decodes the request body, of at most limit bytes, into v
// strictly: one JSON value, no field v does not have (a misspelt field
// would otherwise be ignored and its default silently used). Its errors
// are FieldErrors naming the field at fault ("body" when there is none),
// answered 400 by fail.
func bindJSON(c *gin.Context, v any, limit int64) error {
	if c.Request.Body == nil {
		return &FieldError{Field: "body", Message: "empty body: want a JSON object", reason: reasonBadJSON}
	}
	b, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, limit))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return &FieldError{Field: "body", Message: "larger than " + strconv.FormatInt(mbe.Limit, 10) + " bytes", reason: reasonBadJSON}
	}
	if err != nil {
		return &FieldError{Field: "body", Message: "read: " + err.Error(), reason: reasonBadJSON}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	err = dec.Decode(v)
	if err == nil {
		if dec.More() {
			return &FieldError{Field: "body", Message: "bad JSON: more than one value", reason: reasonBadJSON}
		}
		if _, err := dec.Token(); err != nil && !errors.Is(err, io.EOF) {
			return &FieldError{Field: "body", Message: "bad JSON: " + err.Error(), reason: reasonBadJSON}
		}
		return nil
	}
	var te *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF):
		return &FieldError{Field: "body", Message: "empty body: want a JSON object", reason: reasonBadJSON}
	case errors.As(err, &te) && te.Field != "":
		return &FieldError{Field: te.Field, Message: "want " + jsonKind(te.Type.Kind().String()) + ", not " + te.Value, reason: reasonBadJSON}
	}
	// encoding/json has no type for it: `json: unknown field "name"`.
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		field, doc := name, any(nil)
		if json.Unmarshal(b, &doc) == nil {
			if p, ok := keyPath(doc, name, ""); ok {
				field = p
			}
		}
		return &FieldError{Field: field, Message: "unknown field " + strconv.Quote(name) + " (see /api/v1/openapi.json for the request's fields)", reason: reasonUnknownField}
	}
	return &FieldError{Field: "body", Message: "bad JSON: " + strings.TrimPrefix(err.Error(), "json: "), reason: reasonBadJSON}
}

// jsonKind names a Go kind in JSON's terms.
func jsonKind(k string) string {
	switch {
	case strings.HasPrefix(k, "int"), strings.HasPrefix(k, "uint"), strings.HasPrefix(k, "float"):
		return "a number in range"
	case k == "string":
		return "a string"
	case k == "bool":
		return "true or false"
	case k == "slice", k == "array":
		return "an array"
	case k == "struct", k == "map":
		return "an object"
	}
	return k
}

// keyPath finds where key occurs in the decoded JSON doc first (objects'
// keys in sorted order, so a key at several places is named the same way
// every time) and returns its path, e.g. "sources[0].nmae".
func keyPath(doc any, key, at string) (string, bool) {
	switch d := doc.(type) {
	case map[string]any:
		join := func(k string) string {
			if at == "" {
				return k
			}
			return at + "." + k
		}
		if _, ok := d[key]; ok {
			return join(key), true
		}
		for _, k := range slices.Sorted(maps.Keys(d)) {
			if p, ok := keyPath(d[k], key, join(k)); ok {
				return p, true
			}
		}
	case []any:
		for i, e := range d {
			if p, ok := keyPath(e, key, at+"["+strconv.Itoa(i)+"]"); ok {
				return p, true
			}
		}
	}
	return "", false
}
