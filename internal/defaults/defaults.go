// Package defaults fills configuration fields left unset.
package defaults

import "fmt"

// Positive returns v, or def when v is not positive: unset, or a negative
// flag value, which no bound or size means.
func Positive[T ~int | ~int64 | ~float64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// RequirePositive returns an error naming the field when v is not
// positive, nil otherwise: the check of a field that has no default.
func RequirePositive[T ~int | ~int64 | ~float64](name string, v T) error {
	if v <= 0 {
		return fmt.Errorf("%s %v: must be positive", name, v)
	}
	return nil
}
