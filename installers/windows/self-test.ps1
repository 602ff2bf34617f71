<#
  Run `sapling.exe --self-test` with its output captured; fail on a non-zero exit code, on a run
  without a PASSED line, or past the time limit.

    pwsh -NoProfile -File installers\windows\self-test.ps1 -Exe path\to\sapling.exe [-TimeoutSeconds 1500]

  sapling.exe is a windowed (GUI) program, so started from a console its output goes nowhere.
  Started here with its stdout and stderr redirected to files, Python writes to them: the log shows
  what the self-test printed, and the traceback Python prints before PyInstaller's
  unhandled-exception dialog (the spec sets disable_windowed_traceback, so the dialog itself shows
  none). That dialog waits for a click that never comes on a CI runner, so a run past the limit has
  its whole process tree (the app and the engine it started) killed. The app's own limit is 900 s.
  Used by .github/workflows/build-windows.yml, directly and through smoke-install.ps1.
#>
param(
    [Parameter(Mandatory = $true)][string]$Exe,
    [int]$TimeoutSeconds = 1500
)
$ErrorActionPreference = 'Stop'
if (-not (Test-Path -LiteralPath $Exe -PathType Leaf)) { throw "self-test: no such program: $Exe" }

$logs = Join-Path ([IO.Path]::GetTempPath()) ("sapling-self-test-" + [guid]::NewGuid().ToString('N'))
New-Item -ItemType Directory -Path $logs | Out-Null
$out = Join-Path $logs 'stdout.txt'
$err = Join-Path $logs 'stderr.txt'
$env:QT_QPA_PLATFORM = 'offscreen'

$started = Get-Date
$process = Start-Process -FilePath $Exe -ArgumentList '--self-test' -NoNewWindow -PassThru `
    -RedirectStandardOutput $out -RedirectStandardError $err
$null = $process.Handle  # hold the handle, or ExitCode is lost once the process ends
$finished = $process.WaitForExit($TimeoutSeconds * 1000)
if (-not $finished) {
    $process.Kill($true)  # the entire tree: the app and its engine
    $process.WaitForExit()
}
$seconds = [math]::Round(((Get-Date) - $started).TotalSeconds)

Write-Output "--- sapling --self-test: stdout ($seconds s) ---"
if (Test-Path -LiteralPath $out) { Get-Content -LiteralPath $out }
Write-Output "--- sapling --self-test: stderr ---"
if (Test-Path -LiteralPath $err) { Get-Content -LiteralPath $err }
Write-Output "--- end ---"

if (-not $finished) { throw "self-test: $Exe ran past $TimeoutSeconds s (a hang, or an error dialog) and was killed" }
if ($process.ExitCode -ne 0) { throw "self-test: $Exe exited with $($process.ExitCode)" }
if (-not (Select-String -LiteralPath $out -Pattern 'PASSED' -SimpleMatch -Quiet)) {
    throw "self-test: $Exe exited with 0 but printed no PASSED line"
}
Write-Output "self-test: $Exe PASSED in $seconds s"
