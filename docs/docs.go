// Package docs embeds the documents the product serves as they are
// written: schema.md, the SQL interface (tables, columns, the REST names
// of the columns and example queries), which GET /api/v1/schema serves
// and the web UI's SQL page lists. collector/store runs its example
// queries against the engine, and sqlguard checks they pass the guard.
package docs

import _ "embed"

// Schema is docs/schema.md (Markdown).
//
//go:embed schema.md
var Schema []byte
