module ds4go

go 1.26
