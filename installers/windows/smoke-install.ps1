<#
  Install Sapling as a user would, silently; run the installed app's self-test; uninstall it
  silently; check that nothing the installer wrote is left.

    pwsh -NoProfile -File installers\windows\smoke-install.ps1 -Setup dist\Sapling-0.1.0-setup.exe [-TimeoutSeconds 1500]

  What the per-user installer writes (installers/windows/sapling.nsi, default components):
  %LOCALAPPDATA%\Programs\Sapling, the Start menu and desktop shortcuts, HKCU\Software\Sapling,
  the Settings > Apps entry and the sapling:// scheme (HKCU\Software\Classes\sapling). The user's
  data folder (%LOCALAPPDATA%\sapling) is theirs and stays: the self-test runs in a temporary home.
  The NSIS uninstaller copies itself to %TEMP%, starts that copy and returns at once, so its end is
  awaited by polling for the install folder, with a deadline. Used by build-windows.yml.
#>
param(
    [Parameter(Mandatory = $true)][string]$Setup,
    [int]$TimeoutSeconds = 1500
)
$ErrorActionPreference = 'Stop'

$instDir = Join-Path $env:LOCALAPPDATA 'Programs\Sapling'
$exe = Join-Path $instDir 'sapling.exe'
$uninstaller = Join-Path $instDir 'Uninstall.exe'
$shortcuts = @(
    (Join-Path ([Environment]::GetFolderPath('Programs')) 'Sapling.lnk'),
    (Join-Path ([Environment]::GetFolderPath('Desktop')) 'Sapling.lnk')
)
$keys = @(
    'HKCU:\Software\Sapling',
    'HKCU:\Software\Microsoft\Windows\CurrentVersion\Uninstall\Sapling',
    'HKCU:\Software\Classes\sapling'
)
if (Test-Path -LiteralPath $instDir) { throw "smoke-install: $instDir exists before the install; run this on a clean account" }

# Install.
$setupProcess = Start-Process -FilePath (Resolve-Path -LiteralPath $Setup).Path -ArgumentList '/S' -PassThru -Wait
if ($setupProcess.ExitCode -ne 0) { throw "smoke-install: the installer exited with $($setupProcess.ExitCode)" }
foreach ($path in @($exe, $uninstaller) + $shortcuts) {
    if (-not (Test-Path -LiteralPath $path)) { throw "smoke-install: missing after the install: $path" }
}
foreach ($key in $keys) {
    if (-not (Test-Path -LiteralPath $key)) { throw "smoke-install: registry key missing after the install: $key" }
}
$command = (Get-ItemProperty -LiteralPath 'HKCU:\Software\Classes\sapling\shell\open\command').'(default)'
$expected = "`"$exe`" `"%1`""
if ($command -ne $expected) { throw "smoke-install: sapling:// links run '$command', expected '$expected'" }
if ($null -eq (Get-ItemProperty -LiteralPath 'HKCU:\Software\Classes\sapling').'URL Protocol') {
    throw "smoke-install: HKCU\Software\Classes\sapling has no 'URL Protocol' value, so Windows ignores it"
}
Write-Output "smoke-install: installed into $instDir"

# The installed app, as the Start menu shortcut starts it.
& (Join-Path $PSScriptRoot 'self-test.ps1') -Exe $exe -TimeoutSeconds $TimeoutSeconds

# Uninstall, and wait for the uninstaller's copy in %TEMP% to finish.
$uninstallProcess = Start-Process -FilePath $uninstaller -ArgumentList '/S' -PassThru -Wait
if ($uninstallProcess.ExitCode -ne 0) { throw "smoke-install: the uninstaller exited with $($uninstallProcess.ExitCode)" }
$deadline = (Get-Date).AddSeconds(180)
while ((Test-Path -LiteralPath $instDir) -and ((Get-Date) -lt $deadline)) { Start-Sleep -Seconds 2 }

$left = @()
foreach ($path in @($instDir) + $shortcuts) { if (Test-Path -LiteralPath $path) { $left += $path } }
foreach ($key in $keys) { if (Test-Path -LiteralPath $key) { $left += $key } }
$run = Get-ItemProperty -LiteralPath 'HKCU:\Software\Microsoft\Windows\CurrentVersion\Run' -Name 'Sapling' -ErrorAction SilentlyContinue
if ($null -ne $run) { $left += 'HKCU\Software\Microsoft\Windows\CurrentVersion\Run\Sapling' }
if ($left.Count -gt 0) {
    if (Test-Path -LiteralPath $instDir) { Get-ChildItem -LiteralPath $instDir -Recurse | Select-Object -First 20 -ExpandProperty FullName }
    throw "smoke-install: left behind after the uninstall: $($left -join ', ')"
}
Write-Output "smoke-install: installed, self-tested and uninstalled $Setup; nothing it wrote is left"
