//go:build !linux

package observe

// LoadTable is Linux only.
func LoadTable(nsPath string, t Table) error { return ErrUnsupported }

// DeleteTable is Linux only.
func DeleteTable(nsPath, name string) error { return ErrUnsupported }

// ListTables is Linux only.
func ListTables(nsPath string) ([]string, error) { return nil, ErrUnsupported }
