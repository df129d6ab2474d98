// Package object handles Kubernetes objects as the JSON the API server sends to webhooks:
// untyped maps (numbers kept exact as json.Number), so that no field is lost or reordered on
// the way through the harness.
package object

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// Object is a JSON object.
type Object = map[string]interface{}

// Decode reads one JSON object, numbers as json.Number.
func Decode(data []byte) (Object, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var o Object
	if err := dec.Decode(&o); err != nil {
		return nil, err
	}
	if o == nil {
		return nil, fmt.Errorf("not a JSON object")
	}
	return o, nil
}

// Encode writes o as compact JSON.
func Encode(o interface{}) []byte {
	b, err := json.Marshal(o)
	if err != nil {
		panic(fmt.Sprintf("object: cannot encode: %v", err))
	}
	return b
}

// Copy returns a deep copy of o.
func Copy(o Object) Object {
	c, err := Decode(Encode(o))
	if err != nil {
		panic(err)
	}
	return c
}

// Map returns v as an object, or nil.
func Map(v interface{}) Object {
	m, _ := v.(map[string]interface{})
	return m
}

// Slice returns v as an array, or nil.
func Slice(v interface{}) []interface{} {
	s, _ := v.([]interface{})
	return s
}

// Maps returns the objects of the array v.
func Maps(v interface{}) []Object {
	var out []Object
	for _, e := range Slice(v) {
		if m := Map(e); m != nil {
			out = append(out, m)
		}
	}
	return out
}

// Str returns v as a string, or "".
func Str(v interface{}) string {
	s, _ := v.(string)
	return s
}

// Int returns v as an integer.
func Int(v interface{}) (int64, bool) {
	switch n := v.(type) {
	case json.Number:
		i, err := strconv.ParseInt(string(n), 10, 64)
		return i, err == nil
	case float64:
		return int64(n), float64(int64(n)) == n
	case int:
		return int64(n), true
	case int64:
		return n, true
	}
	return 0, false
}

// Bool returns v as a boolean and whether it is one.
func Bool(v interface{}) (bool, bool) {
	b, ok := v.(bool)
	return b, ok
}

// Get follows keys through nested objects.
func Get(o Object, keys ...string) interface{} {
	var v interface{} = o
	for _, k := range keys {
		m := Map(v)
		if m == nil {
			return nil
		}
		v = m[k]
	}
	return v
}

// Child returns o[key] as an object, creating it when absent.
func Child(o Object, key string) Object {
	if m := Map(o[key]); m != nil {
		return m
	}
	m := Object{}
	o[key] = m
	return m
}

// SetDefault sets o[key] = v when o has no such key.
func SetDefault(o Object, key string, v interface{}) {
	if _, ok := o[key]; !ok || o[key] == nil {
		o[key] = v
	}
}

// Num is an integer as the JSON decoder gives it.
func Num(i int64) json.Number { return json.Number(strconv.FormatInt(i, 10)) }
