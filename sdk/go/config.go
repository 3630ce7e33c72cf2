package transform

import (
	"encoding"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Config is the route's `config:` map (values are strings), with typed parsing.
type Config struct {
	pairs [][2]string
}

// NewConfig makes a Config of these key, value pairs (for tests of transforms).
func NewConfig(pairs [][2]string) *Config {
	return &Config{pairs: pairs}
}

// Pairs returns every pair, in the order the pipeline lists them.
func (c *Config) Pairs() [][2]string { return c.pairs }

// Lookup returns the value of key and whether it is set.
func (c *Config) Lookup(key string) (string, bool) {
	for _, kv := range c.pairs {
		if kv[0] == key {
			return kv[1], true
		}
	}
	return "", false
}

// Get returns the value of key, or fallback when it is unset.
func (c *Config) Get(key, fallback string) string {
	if v, ok := c.Lookup(key); ok {
		return v
	}
	return fallback
}

// List returns the comma-separated items of key, trimmed, empty ones left out; none when
// unset.
func (c *Config) List(key string) []string {
	v, _ := c.Lookup(key)
	var items []string
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			items = append(items, item)
		}
	}
	return items
}

// AllowOnly returns an error naming the first key that is not one of known: a typo in a
// pipeline's config should stop it at startup, not be ignored.
func (c *Config) AllowOnly(known ...string) error {
	for _, kv := range c.pairs {
		found := false
		for _, k := range known {
			found = found || k == kv[0]
		}
		if !found {
			expected := strings.Join(known, ", ")
			if len(known) == 0 {
				expected = "none"
			}
			return fmt.Errorf("unknown config key `%s`; expected %s", kv[0], expected)
		}
	}
	return nil
}

// Parse returns key parsed as a T (a string, bool, int, int64, uint64, float64,
// time.Duration, or a type whose pointer is an encoding.TextUnmarshaler), or fallback when
// it is unset. The error names the key and the value.
func Parse[T any](c *Config, key string, fallback T) (T, error) {
	v, ok := c.Lookup(key)
	if !ok {
		return fallback, nil
	}
	var t T
	if err := parseInto(&t, strings.TrimSpace(v)); err != nil {
		return fallback, fmt.Errorf("config `%s`: cannot read `%s`: %v", key, v, err)
	}
	return t, nil
}

// Require is Parse for a key that must be set.
func Require[T any](c *Config, key string) (T, error) {
	var zero T
	if _, ok := c.Lookup(key); !ok {
		return zero, fmt.Errorf("config `%s` is required", key)
	}
	return Parse(c, key, zero)
}

func parseInto(p any, s string) error {
	var err error
	switch p := p.(type) {
	case *string:
		*p = s
	case *bool:
		*p, err = strconv.ParseBool(s)
	case *int:
		*p, err = strconv.Atoi(s)
	case *int64:
		*p, err = strconv.ParseInt(s, 10, 64)
	case *uint64:
		*p, err = strconv.ParseUint(s, 10, 64)
	case *float64:
		*p, err = strconv.ParseFloat(s, 64)
	case *time.Duration:
		*p, err = time.ParseDuration(s)
	case encoding.TextUnmarshaler:
		err = p.UnmarshalText([]byte(s))
	default:
		return fmt.Errorf("cannot parse into %T", p)
	}
	if ne, ok := err.(*strconv.NumError); ok {
		err = ne.Err // the key and value are named already
	}
	return err
}
