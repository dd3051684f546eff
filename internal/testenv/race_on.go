//go:build race

package testenv

const raceDetector = true
