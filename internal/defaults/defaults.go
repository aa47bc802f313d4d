// Package defaults fills configuration fields left unset.
package defaults

// Positive returns v, or def when v is not positive: unset, or a negative
// flag value, which no bound or size means.
func Positive[T ~int | ~int64 | ~float64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}
