from rffm.cli import console

console()
