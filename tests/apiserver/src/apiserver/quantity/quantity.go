// Package quantity parses resource quantities as k8s.io/apimachinery/pkg/api/resource does
// (ParseQuantity: decimal SI, binary SI and exponent suffixes), exactly, as rationals.
package quantity

import (
	"fmt"
	"math/big"
	"regexp"
	"strconv"
)

var format = regexp.MustCompile(`^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$`)

var suffixes = map[string]*big.Rat{
	"n": pow(10, -9), "u": pow(10, -6), "m": pow(10, -3), "": big.NewRat(1, 1),
	"k": pow(10, 3), "M": pow(10, 6), "G": pow(10, 9), "T": pow(10, 12), "P": pow(10, 15), "E": pow(10, 18),
	"Ki": pow(2, 10), "Mi": pow(2, 20), "Gi": pow(2, 30), "Ti": pow(2, 40), "Pi": pow(2, 50), "Ei": pow(2, 60),
}

func pow(base, exp int64) *big.Rat {
	if exp < 0 {
		return new(big.Rat).SetFrac(big.NewInt(1), new(big.Int).Exp(big.NewInt(base), big.NewInt(-exp), nil))
	}
	return new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(base), big.NewInt(exp), nil))
}

// Parse reads a quantity; a JSON number is accepted as its decimal text.
func Parse(v interface{}) (*big.Rat, error) {
	s := fmt.Sprint(v)
	m := format.FindStringSubmatch(s)
	if m == nil {
		return nil, fmt.Errorf("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
	}
	num, ok := new(big.Rat).SetString(m[1])
	if !ok {
		return nil, fmt.Errorf("unable to parse quantity's suffix")
	}
	if mult, ok := suffixes[m[2]]; ok {
		return num.Mul(num, mult), nil
	}
	if len(m[2]) > 1 && (m[2][0] == 'e' || m[2][0] == 'E') {
		exp, err := strconv.ParseInt(m[2][1:], 10, 32)
		if err == nil {
			return num.Mul(num, pow(10, exp)), nil
		}
	}
	return nil, fmt.Errorf("unable to parse quantity's suffix")
}
