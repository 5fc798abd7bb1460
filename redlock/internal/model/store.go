package model

import (
	"slices"
	"strconv"
	"strings"
)

// Store is one node's key space: the few Redis commands the scripts use,
// on strings, hashes and lists, with expiry on the node's own clock (Now,
// in ms). A key with expiry exp exists while Now <= exp, as in Redis 7
// (a key expires once the clock is past its expire time; PTTL is 0 at
// that instant). A Store is a value: Clone copies it.
type Store struct {
	Now  int64   // the node's clock, ms
	Keys []Entry // live or expired keys, sorted by Key; Purge drops the expired ones
}

// Entry is one key.
type Entry struct {
	Key  string
	Kind byte     // 's' string, 'h' hash, 'l' list
	Str  string   // 's'
	Hash []Field  // 'h', sorted by Name
	List []string // 'l', head first
	Exp  int64    // expire time on the node's clock (ms), 0 for none
}

// Field is one field of a hash.
type Field struct{ Name, Val string }

// Clone returns a deep copy of s.
func (s Store) Clone() Store {
	c := Store{Now: s.Now, Keys: make([]Entry, len(s.Keys))}
	for i, e := range s.Keys {
		e.Hash, e.List = slices.Clone(e.Hash), slices.Clone(e.List)
		c.Keys[i] = e
	}
	return c
}

// Purge drops the expired keys (Redis expires them lazily or by its
// sampler; no script can tell). It leaves s.Keys's array as it was, so a
// Store copied by value (the explorer's states share arrays) stays
// intact.
func (s *Store) Purge() {
	expired := func(e Entry) bool { return e.Exp != 0 && s.Now > e.Exp }
	if slices.ContainsFunc(s.Keys, expired) {
		s.Keys = slices.DeleteFunc(slices.Clone(s.Keys), expired)
	}
}

// String renders the live keys, one per line: key, kind, value, PTTL.
func (s *Store) String() string {
	var b strings.Builder
	for _, e := range s.Keys {
		if e.Exp != 0 && s.Now > e.Exp {
			continue
		}
		b.WriteString(strconv.Quote(e.Key))
		switch e.Kind {
		case 's':
			b.WriteString(" = " + strconv.Quote(e.Str))
		case 'h':
			b.WriteString(" = {")
			for i, f := range e.Hash {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString(strconv.Quote(f.Name) + ": " + strconv.Quote(f.Val))
			}
			b.WriteString("}")
		case 'l':
			b.WriteString(" = [" + strings.Join(quoteAll(e.List), ", ") + "]")
		}
		if e.Exp != 0 {
			b.WriteString(" pttl " + strconv.FormatInt(e.Exp-s.Now, 10))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func quoteAll(xs []string) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = strconv.Quote(x)
	}
	return out
}

// find returns the index of key if it exists and has not expired, or -1.
func (s *Store) find(key string) int {
	i, ok := slices.BinarySearchFunc(s.Keys, key, func(e Entry, k string) int { return strings.Compare(e.Key, k) })
	if !ok {
		return -1
	}
	if e := s.Keys[i]; e.Exp != 0 && s.Now > e.Exp {
		s.Keys = slices.Delete(s.Keys, i, i+1)
		return -1
	}
	return i
}

// put inserts or replaces e (its expire time included).
func (s *Store) put(e Entry) {
	i, ok := slices.BinarySearchFunc(s.Keys, e.Key, func(x Entry, k string) int { return strings.Compare(x.Key, k) })
	if ok {
		s.Keys[i] = e
		return
	}
	s.Keys = slices.Insert(s.Keys, i, e)
}

// Get is GET: the string value, or false for a missing key (Lua's false).
func (s *Store) Get(key string) (string, bool) {
	i := s.find(key)
	if i < 0 || s.Keys[i].Kind != 's' {
		return "", false
	}
	return s.Keys[i].Str, true
}

// Set is SET key val [PX px] [NX]: false when NX found the key.
func (s *Store) Set(key, val string, px int64, nx bool) bool {
	if nx && s.find(key) >= 0 {
		return false
	}
	var exp int64
	if px > 0 {
		exp = s.Now + px
	}
	s.put(Entry{Key: key, Kind: 's', Str: val, Exp: exp})
	return true
}

// SetRange1 is SETRANGE key off c for one byte inside an existing string
// (the wait mark); the TTL stays.
func (s *Store) SetRange1(key string, off int, c byte) {
	if i := s.find(key); i >= 0 && off < len(s.Keys[i].Str) {
		b := []byte(s.Keys[i].Str)
		b[off] = c
		s.Keys[i].Str = string(b)
	}
}

// PTTL is PTTL: ms left, -1 without expiry, -2 for a missing key.
func (s *Store) PTTL(key string) int64 {
	i := s.find(key)
	switch {
	case i < 0:
		return -2
	case s.Keys[i].Exp == 0:
		return -1
	}
	return s.Keys[i].Exp - s.Now
}

// PExpire is PEXPIRE key ms on an existing key.
func (s *Store) PExpire(key string, ms int64) {
	if i := s.find(key); i >= 0 {
		if ms <= 0 {
			s.Keys = slices.Delete(s.Keys, i, i+1)
			return
		}
		s.Keys[i].Exp = s.Now + ms
	}
}

// Del is DEL key.
func (s *Store) Del(key string) {
	if i := s.find(key); i >= 0 {
		s.Keys = slices.Delete(s.Keys, i, i+1)
	}
}

// hash returns the index of the hash at key, or -1.
func (s *Store) hash(key string) int {
	if i := s.find(key); i >= 0 && s.Keys[i].Kind == 'h' {
		return i
	}
	return -1
}

// HSet is HSET key name val (a new hash has no expiry).
func (s *Store) HSet(key, name, val string) {
	i := s.hash(key)
	if i < 0 {
		s.put(Entry{Key: key, Kind: 'h'})
		i = s.hash(key)
	}
	h := s.Keys[i].Hash
	j, ok := slices.BinarySearchFunc(h, name, func(f Field, n string) int { return strings.Compare(f.Name, n) })
	if ok {
		h[j].Val = val
	} else {
		h = slices.Insert(h, j, Field{name, val})
	}
	s.Keys[i].Hash = h
}

// HGet is HGET: the field's value, or false.
func (s *Store) HGet(key, name string) (string, bool) {
	i := s.hash(key)
	if i < 0 {
		return "", false
	}
	for _, f := range s.Keys[i].Hash {
		if f.Name == name {
			return f.Val, true
		}
	}
	return "", false
}

// HDel is HDEL key name: it returns how many fields it deleted (0 or 1);
// the key goes with its last field.
func (s *Store) HDel(key, name string) int64 {
	i := s.hash(key)
	if i < 0 {
		return 0
	}
	before := len(s.Keys[i].Hash)
	s.Keys[i].Hash = slices.DeleteFunc(s.Keys[i].Hash, func(f Field) bool { return f.Name == name })
	deleted := int64(before - len(s.Keys[i].Hash))
	if len(s.Keys[i].Hash) == 0 {
		s.Keys = slices.Delete(s.Keys, i, i+1)
	}
	return deleted
}

// HLen is HLEN.
func (s *Store) HLen(key string) int64 {
	if i := s.hash(key); i >= 0 {
		return int64(len(s.Keys[i].Hash))
	}
	return 0
}

// LPush is LPUSH key v (a new list has no expiry).
func (s *Store) LPush(key, v string) {
	i := s.find(key)
	if i < 0 || s.Keys[i].Kind != 'l' {
		s.put(Entry{Key: key, Kind: 'l'})
		i = s.find(key)
	}
	s.Keys[i].List = slices.Insert(s.Keys[i].List, 0, v)
}

// LTrim is LTRIM key 0 n-1.
func (s *Store) LTrim(key string, n int) {
	if i := s.find(key); i >= 0 && s.Keys[i].Kind == 'l' && len(s.Keys[i].List) > n {
		s.Keys[i].List = s.Keys[i].List[:n:n]
		if n == 0 {
			s.Keys = slices.Delete(s.Keys, i, i+1)
		}
	}
}

// Time is TIME: seconds and microseconds of the node's clock.
func (s *Store) Time() (sec, usec int64) { return s.Now / 1000, s.Now % 1000 * 1000 }
