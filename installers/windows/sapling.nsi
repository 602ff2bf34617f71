; Sapling for Windows: a per-user installer (no administrator rights needed).
;
;   makensis /DPAYLOAD=C:\path\to\dist\sapling /DVERSION=0.1.0 installers\windows\sapling.nsi
;
; PAYLOAD is the PyInstaller one-folder build (sapling.exe + _internal\) of the CPU
; variant. Optional: /DOUTFILE=... (default Sapling-<VERSION>-setup.exe next to this
; script), /DICON=... (default ..\..\assets\sapling.ico). Relative paths are relative
; to this folder: makensis runs from the script's folder. The CUDA variant is not an
; NSIS installer: its payload is past NSIS's 2 GB limit, so it ships as a zip
; (.github/workflows/build-windows.yml, docs/packaging.md).
;
; What it does: installs into %LOCALAPPDATA%\Programs\Sapling, adds a Start menu
; shortcut, optionally a desktop shortcut and start at sign-in (HKCU Run key),
; registers the sapling:// URL scheme for invite links (HKCU\Software\Classes\sapling)
; and an uninstaller in Settings > Apps (HKCU). The uninstaller removes all of that,
; and on request the user's Sapling data (%LOCALAPPDATA%\sapling).
; `make installer-windows-check` compiles this script on Linux against a stand-in payload.

Unicode true
ManifestDPIAware true
RequestExecutionLevel user
SetCompressor /SOLID lzma
SetCompressorDictSize 64

!ifndef PAYLOAD
  !error "Pass the one-folder build: makensis /DPAYLOAD=path\to\dist\sapling sapling.nsi"
!endif
!ifndef VERSION
  !define VERSION "0.0.0"
!endif
!ifndef ICON
  !define ICON "..\..\assets\sapling.ico"
!endif
!ifndef OUTFILE
  !define OUTFILE "Sapling-${VERSION}-setup.exe"
!endif

; Authenticode: /DSIGN_COMMAND="signtool sign /f cert.pfx /p ... /tr http://timestamp.digicert.com /td sha256 /fd sha256"
; signs the installer and the uninstaller it writes (NSIS substitutes %1 with the file).
!ifdef SIGN_COMMAND
  !finalize '${SIGN_COMMAND} "%1"' = 0
  !uninstfinalize '${SIGN_COMMAND} "%1"' = 0
!endif

!define APP_NAME "Sapling"
!define APP_EXE "sapling.exe"
!define APP_KEY "Software\Sapling"
!define UNINST_KEY "Software\Microsoft\Windows\CurrentVersion\Uninstall\Sapling"
!define RUN_KEY "Software\Microsoft\Windows\CurrentVersion\Run"
; sapling://join?... invite links open Sapling (per user; Windows reads HKCU\Software\Classes first).
!define URL_KEY "Software\Classes\sapling"
; platformdirs' folders for "sapling" on Windows: config, data, cache and logs all live here.
!define USER_DATA "$LOCALAPPDATA\sapling"

Name "${APP_NAME}"
OutFile "${OUTFILE}"
InstallDir "$LOCALAPPDATA\Programs\Sapling"
InstallDirRegKey HKCU "${APP_KEY}" "InstallDir"
BrandingText "${APP_NAME} ${VERSION}"

VIProductVersion "${VERSION}.0"
VIAddVersionKey "ProductName" "${APP_NAME}"
VIAddVersionKey "ProductVersion" "${VERSION}"
VIAddVersionKey "FileVersion" "${VERSION}"
VIAddVersionKey "FileDescription" "${APP_NAME} installer"
VIAddVersionKey "CompanyName" "Sapling contributors"
VIAddVersionKey "LegalCopyright" "Apache-2.0"

!include "MUI2.nsh"
!include "FileFunc.nsh"

!define MUI_ICON "${ICON}"
!define MUI_UNICON "${ICON}"
!define MUI_ABORTWARNING
!define MUI_COMPONENTSPAGE_SMALLDESC
!define MUI_FINISHPAGE_RUN "$INSTDIR\${APP_EXE}"
!define MUI_FINISHPAGE_RUN_TEXT "Start Sapling now"

!insertmacro MUI_PAGE_WELCOME
!insertmacro MUI_PAGE_COMPONENTS
!insertmacro MUI_PAGE_DIRECTORY
!insertmacro MUI_PAGE_INSTFILES
!insertmacro MUI_PAGE_FINISH

!insertmacro MUI_UNPAGE_CONFIRM
!insertmacro MUI_UNPAGE_COMPONENTS
!insertmacro MUI_UNPAGE_INSTFILES

!insertmacro MUI_LANGUAGE "English"

Section "Sapling (required)" SecApp
  SectionIn RO
  SetOutPath "$INSTDIR"
  ; An update first drops the old bundle, so no stale library from an older build survives.
  RMDir /r "$INSTDIR\_internal"
  File /r "${PAYLOAD}\*"
  WriteUninstaller "$INSTDIR\Uninstall.exe"

  CreateShortcut "$SMPROGRAMS\Sapling.lnk" "$INSTDIR\${APP_EXE}" "" "$INSTDIR\${APP_EXE}" 0

  WriteRegStr HKCU "${APP_KEY}" "InstallDir" "$INSTDIR"
  WriteRegStr HKCU "${UNINST_KEY}" "DisplayName" "${APP_NAME}"
  WriteRegStr HKCU "${UNINST_KEY}" "DisplayVersion" "${VERSION}"
  WriteRegStr HKCU "${UNINST_KEY}" "Publisher" "Sapling contributors"
  WriteRegStr HKCU "${UNINST_KEY}" "DisplayIcon" "$INSTDIR\${APP_EXE}"
  WriteRegStr HKCU "${UNINST_KEY}" "InstallLocation" "$INSTDIR"
  WriteRegStr HKCU "${UNINST_KEY}" "UninstallString" '"$INSTDIR\Uninstall.exe"'
  WriteRegStr HKCU "${UNINST_KEY}" "QuietUninstallString" '"$INSTDIR\Uninstall.exe" /S'
  WriteRegDWORD HKCU "${UNINST_KEY}" "NoModify" 1
  WriteRegDWORD HKCU "${UNINST_KEY}" "NoRepair" 1
  ${GetSize} "$INSTDIR" "/S=0K" $0 $1 $2
  IntFmt $0 "0x%08X" $0
  WriteRegDWORD HKCU "${UNINST_KEY}" "EstimatedSize" "$0"

  WriteRegStr HKCU "${URL_KEY}" "" "URL:Sapling invite"
  WriteRegStr HKCU "${URL_KEY}" "URL Protocol" ""
  WriteRegStr HKCU "${URL_KEY}\DefaultIcon" "" '"$INSTDIR\${APP_EXE}",0'
  WriteRegStr HKCU "${URL_KEY}\shell\open\command" "" '"$INSTDIR\${APP_EXE}" "%1"'
SectionEnd

Section "Desktop shortcut" SecDesktop
  CreateShortcut "$DESKTOP\Sapling.lnk" "$INSTDIR\${APP_EXE}" "" "$INSTDIR\${APP_EXE}" 0
SectionEnd

Section /o "Start Sapling when I sign in" SecLogin
  ; The same value the app's own "Start at login" setting writes (app/autostart.py).
  WriteRegStr HKCU "${RUN_KEY}" "Sapling" '"$INSTDIR\${APP_EXE}" --background'
SectionEnd

!insertmacro MUI_FUNCTION_DESCRIPTION_BEGIN
  !insertmacro MUI_DESCRIPTION_TEXT ${SecApp} "The Sapling app, its engine and the bundled model. Works offline."
  !insertmacro MUI_DESCRIPTION_TEXT ${SecDesktop} "Put a Sapling shortcut on the desktop."
  !insertmacro MUI_DESCRIPTION_TEXT ${SecLogin} "Start Sapling in the background each time you sign in to Windows."
!insertmacro MUI_FUNCTION_DESCRIPTION_END

Section "un.Sapling" UnSecApp
  SectionIn RO
  Delete "$SMPROGRAMS\Sapling.lnk"
  Delete "$DESKTOP\Sapling.lnk"
  DeleteRegValue HKCU "${RUN_KEY}" "Sapling"
  DeleteRegKey HKCU "${UNINST_KEY}"
  DeleteRegKey HKCU "${APP_KEY}"
  DeleteRegKey HKCU "${URL_KEY}"
  ; Only what the installer put there: never RMDir /r a folder the user may have chosen.
  RMDir /r "$INSTDIR\_internal"
  Delete "$INSTDIR\${APP_EXE}"
  Delete "$INSTDIR\Uninstall.exe"
  RMDir "$INSTDIR"
SectionEnd

Section /o "un.My Sapling data (settings, checkpoints, trained models, logs)" UnSecData
  RMDir /r "${USER_DATA}"
SectionEnd

!insertmacro MUI_UNFUNCTION_DESCRIPTION_BEGIN
  !insertmacro MUI_DESCRIPTION_TEXT ${UnSecApp} "Remove the Sapling app and its shortcuts."
  !insertmacro MUI_DESCRIPTION_TEXT ${UnSecData} "Also delete ${USER_DATA}: your settings, checkpoints, exported models and logs. Leave unticked to keep them for a later install."
!insertmacro MUI_UNFUNCTION_DESCRIPTION_END
